//! Masking credentials in text bound for logs.

use super::TOKEN_PREFIX;

/// A run this long after `hive_` or `Bearer ` is treated as a credential. Real tokens have
/// 43 characters after the prefix; shorter runs are identifiers such as `hive_api`, and a
/// fragment of fewer than 16 base64 characters of a token is no use to anyone.
const MIN_SECRET_CHARS: usize = 16;
const MASK: &str = "<redacted>";

/// Returns `s` with everything that looks like a hive token (`hive_` followed by a long
/// base64url run), or like the credential of a `Bearer` authorization value, replaced by
/// `<redacted>`. For log lines and error messages that may quote a request.
pub fn redact(s: &str) -> String {
    mask_after(&mask_after(s, TOKEN_PREFIX, is_token_char), "bearer ", |b| !b.is_ascii_whitespace())
}

fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// Replaces the run of `secret_char` bytes following each (ASCII case-insensitive)
/// occurrence of `marker` with [`MASK`] when the run is long enough to be a credential.
fn mask_after(s: &str, marker: &str, secret_char: impl Fn(u8) -> bool) -> String {
    // ASCII lowercasing keeps byte offsets, so positions found in `lower` index `s`.
    let lower = s.to_ascii_lowercase();
    let mut out = String::with_capacity(s.len());
    let mut done = 0;
    let mut search = 0;
    while let Some(found) = lower[search..].find(marker) {
        let start = search + found + marker.len();
        let run = s.as_bytes()[start..].iter().take_while(|&&b| secret_char(b)).count();
        if run >= MIN_SECRET_CHARS {
            out.push_str(&s[done..start]);
            out.push_str(MASK);
            done = start + run;
            search = done;
        } else {
            search = start;
        }
    }
    out.push_str(&s[done..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_tokens_and_bearer_values() {
        let token = "hive_Zm9vYmFyYmF6cXV4Zm9vYmFyYmF6cXV4Zm9vYmFyYmE";
        let cases = [
            (format!("token={token}"), "token=hive_<redacted>".to_owned()),
            (format!("{token} and {token}."), "hive_<redacted> and hive_<redacted>.".to_owned()),
            (format!("Authorization: Bearer {token}"), "Authorization: Bearer hive_<redacted>".to_owned()),
            (
                "authorization: bearer eyJhbGciOiJSUzI1NiJ9.payload.sig rest".to_owned(),
                "authorization: bearer <redacted> rest".to_owned(),
            ),
            // Too short to be a secret: identifiers and prose stay readable.
            (
                "crate hive_api and hive_controllers".to_owned(),
                "crate hive_api and hive_controllers".to_owned(),
            ),
            ("missing bearer token".to_owned(), "missing bearer token".to_owned()),
            ("hive_".to_owned(), "hive_".to_owned()),
            ("ünïcödé hive_ ok".to_owned(), "ünïcödé hive_ ok".to_owned()),
            (format!("ü{token}ü"), "ühive_<redacted>ü".to_owned()),
        ];
        for (input, want) in cases {
            assert_eq!(redact(&input), want, "{input}");
        }
    }
}
