//! Durations on the command line, as kubectl (Go) writes them: `30s`, `5m`, `1h`,
//! `1m30s`, `500ms`, `1.5h`; a bare `0` means zero.

use std::time::Duration;

/// Parses a duration; usable as a clap `value_parser`.
pub fn parse(text: &str) -> Result<Duration, String> {
    let input = text.trim();
    if input.is_empty() {
        return Err("empty duration (use e.g. 30s, 5m or 1h)".to_string());
    }
    if input == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total = 0f64;
    let mut rest = input;
    while !rest.is_empty() {
        let number_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let number = &rest[..number_len];
        if number.is_empty() || number == "." {
            return Err(format!("invalid duration {text:?}: expected a number before {rest:?}"));
        }
        let value: f64 =
            number.parse().map_err(|_| format!("invalid duration {text:?}: bad number {number:?}"))?;
        rest = &rest[number_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        let seconds = match unit {
            "ms" => 0.001,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => {
                return Err(format!(
                    "invalid duration {text:?}: missing unit after {number:?} (use ms, s, m or h)"
                ))
            }
            other => {
                return Err(format!("invalid duration {text:?}: unknown unit {other:?} (use ms, s, m or h)"))
            }
        };
        total += value * seconds;
        rest = &rest[unit_len..];
    }
    if !total.is_finite() || total > 1e12 {
        return Err(format!("invalid duration {text:?}: too large"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration the way it was most likely written: `30s`, `5m`, `1h30m`.
pub fn format(d: Duration) -> String {
    let total = d.as_secs();
    if total == 0 && d.subsec_millis() > 0 {
        return format!("{}ms", d.subsec_millis());
    }
    let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
    let mut out = String::new();
    if h > 0 {
        out.push_str(&format!("{h}h"));
    }
    if m > 0 {
        out.push_str(&format!("{m}m"));
    }
    if s > 0 || out.is_empty() {
        out.push_str(&format!("{s}s"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        let cases = [
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("1m30s", 90_000),
            ("1h2m3s", 3_723_000),
            ("500ms", 500),
            ("1.5h", 5_400_000),
            ("0", 0),
            ("0s", 0),
            (" 10s ", 10_000),
        ];
        for (text, millis) in cases {
            assert_eq!(parse(text).unwrap(), Duration::from_millis(millis), "{text}");
        }
    }

    #[test]
    fn rejects_bad_durations_with_reasons() {
        assert_eq!(
            parse("30").unwrap_err(),
            "invalid duration \"30\": missing unit after \"30\" (use ms, s, m or h)"
        );
        assert_eq!(
            parse("5x").unwrap_err(),
            "invalid duration \"5x\": unknown unit \"x\" (use ms, s, m or h)"
        );
        assert_eq!(parse("s").unwrap_err(), "invalid duration \"s\": expected a number before \"s\"");
        assert!(parse("").is_err());
        assert!(parse("1d").is_err());
        assert!(parse("-1s").is_err());
    }

    #[test]
    fn formats_round_trip() {
        for text in ["30s", "5m", "1h30m", "2h", "1m5s", "250ms", "0s"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
