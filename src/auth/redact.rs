//! Masking credentials in text bound for logs, errors and statuses: [`redact`] for
//! anything that looks like a hive token or a `Bearer` value, [`SecretForms`] for one
//! known secret (a provider's API key) in every form it may take in text hive did not
//! write itself.

use base64::Engine as _;
use percent_encoding::{utf8_percent_encode, AsciiSet, NON_ALPHANUMERIC};

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

/// Characters a URL component leaves as they are (RFC 3986 "unreserved").
const COMPONENT: &AsciiSet = &NON_ALPHANUMERIC.remove(b'-').remove(b'.').remove(b'_').remove(b'~');

/// Base64 fragments shorter than this are not masked: a secret of a few bytes gives
/// fragments that occur in ordinary text by chance, and are no use to anyone.
const MIN_BASE64_FRAGMENT: usize = 8;

/// One known secret and the forms it takes in text written by others — a server's error
/// body that echoes the request, a transport error that quotes a URL, a JSON document:
///
/// - as it is, in **any letter case** (matched ASCII case-insensitively, so `KEY`,
///   `key` and `kEy` are one form);
/// - **percent-encoded** as a URL component, every byte encoded, or as a form value
///   (`+` for a space), either hex case;
/// - **JSON-escaped** (`\"`, `\\`, `\/`, `\u00XX`);
/// - **base64**, standard and URL-safe alphabets, padded or not, alone or inside a
///   longer encoding (`Basic` credentials, a token): the three byte alignments are each
///   matched on the characters that depend only on the secret.
///
/// Built once per secret; [`SecretForms::redact`] masks every form in one pass.
#[derive(Clone, Default)]
pub struct SecretForms {
    /// Lowercase forms, matched against the lowercased text.
    any_case: Vec<String>,
    /// Case-sensitive forms (base64).
    exact: Vec<String>,
}

impl std::fmt::Debug for SecretForms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretForms(<redacted>)")
    }
}

impl SecretForms {
    /// The forms of `secret` (none for an empty one).
    pub fn of(secret: &str) -> SecretForms {
        if secret.is_empty() {
            return SecretForms::default();
        }
        let mut any_case = vec![
            secret.to_string(),
            utf8_percent_encode(secret, COMPONENT).to_string(),
            secret.bytes().map(|b| format!("%{b:02X}")).collect(),
            utf8_percent_encode(secret, COMPONENT).to_string().replace("%20", "+"),
        ];
        let json = serde_json::to_string(secret).unwrap_or_default();
        let json = json.trim_matches('"').to_string();
        any_case.push(json.replace('/', "\\/"));
        any_case.push(json);
        any_case.push(secret.chars().map(|c| format!("\\u{:04x}", u32::from(c))).collect());
        let mut any_case: Vec<String> = any_case.into_iter().map(|f| f.to_ascii_lowercase()).collect();
        any_case.sort();
        any_case.dedup();

        let bytes = secret.as_bytes();
        let mut exact = Vec::new();
        for engine in [&base64::engine::general_purpose::STANDARD, &base64::engine::general_purpose::URL_SAFE]
        {
            let whole = engine.encode(bytes);
            exact.push(whole.trim_end_matches('=').to_string());
            exact.push(whole);
            for offset in 0..3usize {
                let mut shifted = vec![0u8; offset];
                shifted.extend_from_slice(bytes);
                let encoded = engine.encode(&shifted);
                // Characters whose 6 bits all come from the secret: after the `offset`
                // leading bytes, up to the last complete one.
                let first = (offset * 8).div_ceil(6);
                let last = (offset + bytes.len()) * 8 / 6;
                if last > first && last - first >= MIN_BASE64_FRAGMENT {
                    exact.push(encoded[first..last].to_string());
                }
            }
        }
        exact.retain(|f| !f.is_empty());
        exact.sort();
        exact.dedup();
        SecretForms { any_case, exact }
    }

    /// `text` with every occurrence of any form of the secret replaced by `mask`
    /// (overlapping occurrences become one mask).
    pub fn redact(&self, text: &str, mask: &str) -> String {
        if self.any_case.is_empty() && self.exact.is_empty() {
            return text.to_string();
        }
        // ASCII lowercasing keeps byte offsets, so ranges found in `lower` index `text`.
        let lower = text.to_ascii_lowercase();
        let mut ranges = Vec::new();
        for (haystack, forms) in [(lower.as_str(), &self.any_case), (text, &self.exact)] {
            for form in forms {
                let mut from = 0;
                while let Some(at) = haystack[from..].find(form.as_str()) {
                    let start = from + at;
                    ranges.push((start, start + form.len()));
                    from = start + 1;
                    while !haystack.is_char_boundary(from) {
                        from += 1;
                    }
                }
            }
        }
        if ranges.is_empty() {
            return text.to_string();
        }
        ranges.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut done = 0;
        let mut iter = ranges.into_iter().peekable();
        while let Some((start, mut end)) = iter.next() {
            while let Some(&(next_start, next_end)) = iter.peek() {
                if next_start > end {
                    break;
                }
                end = end.max(next_end);
                iter.next();
            }
            // Forms are ASCII or whole UTF-8 sequences of the secret, so every match
            // starts and ends on a character boundary of `text`.
            out.push_str(&text[done..start]);
            out.push_str(mask);
            done = end;
        }
        out.push_str(&text[done..]);
        out
    }
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

    #[test]
    fn a_known_secret_is_masked_in_every_form() {
        let key = "Sk-4f/+Z9q_Vast-Key.0123456789";
        let forms = SecretForms::of(key);
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        let b64url = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        let cases = [
            ("as it is", format!("bad key: {key}!")),
            ("upper case", format!("bad key: {}!", key.to_uppercase())),
            ("lower case", format!("bad key: {}!", key.to_lowercase())),
            ("URL-encoded", format!("bad key: {}!", utf8_percent_encode(key, COMPONENT))),
            (
                "URL-encoded, lower hex",
                format!("bad key: {}!", utf8_percent_encode(key, COMPONENT).to_string().to_lowercase()),
            ),
            (
                "every byte encoded",
                format!("bad key: {}!", key.bytes().map(|b| format!("%{b:02x}")).collect::<String>()),
            ),
            ("base64", format!("bad key: {}!", b64(key))),
            ("base64url", format!("bad key: {}!", b64url(key))),
            (
                "base64 inside Basic credentials",
                format!("Authorization: Basic {}", b64(&format!("user:{key}"))),
            ),
            ("base64 at the other alignment", format!("Basic {}", b64(&format!("ab:{key}")))),
            ("JSON-escaped", format!("{{\"key\":{}}}", serde_json::to_string(key).unwrap())),
            ("JSON with escaped slashes", format!("{{\"key\":\"{}\"}}", key.replace('/', "\\/"))),
            (
                "JSON unicode escapes",
                format!("\"{}\"", key.chars().map(|c| format!("\\u{:04X}", c as u32)).collect::<String>()),
            ),
        ];
        for (what, text) in cases {
            let out = forms.redact(&text, "[redacted]");
            assert!(out.contains("[redacted]"), "{what}: nothing masked in {text:?}");
            for leak in [key.to_string(), key.to_lowercase(), b64(key), b64url(key)] {
                assert!(!out.contains(&leak), "{what}: {out:?}");
            }
            // No run of 12 characters of the secret survives in any case.
            let lower = out.to_lowercase();
            for window in key.to_lowercase().as_bytes().windows(12) {
                assert!(!lower.contains(std::str::from_utf8(window).unwrap()), "{what}: {out:?}");
            }
        }
        // The rest of the text stays readable; overlapping forms become one mask.
        assert_eq!(forms.redact(&format!("a {key}{key} b"), "<m>"), "a <m> b");
        assert_eq!(forms.redact("nothing secret here", "<m>"), "nothing secret here");
        assert_eq!(forms.redact(&format!("ü{key}ü"), "<m>"), "ü<m>ü");
        // A short secret masks itself and its case variants, not base64 noise.
        let short = SecretForms::of("k");
        assert_eq!(short.redact("K k a", "*"), "* * a");
        assert_eq!(SecretForms::of("").redact("text", "*"), "text");
        assert!(!format!("{forms:?}").contains(key));
    }
}
