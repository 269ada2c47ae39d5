//! How the bench writes numbers for people: counts with thousands separators, durations
//! in the unit that suits them, and bytes.

use std::time::Duration;

/// `0.42 ms`, `12.3 ms`, `1.25 s`.
pub(super) fn fmt_duration(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    if ms < 10.0 {
        format!("{ms:.2} ms")
    } else if ms < 1000.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{:.2} s", ms / 1000.0)
    }
}

/// `12,345`.
pub(super) fn fmt_count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// `724 B`, `12.3 KiB`, `973 MiB`, `2.37 GiB`.
pub(super) fn fmt_bytes(bytes: f64) -> String {
    const KIB: f64 = 1024.0;
    let sign = if bytes < 0.0 { "−" } else { "" };
    let b = bytes.abs();
    if b < KIB {
        format!("{sign}{b:.0} B")
    } else if b < KIB * KIB {
        format!("{sign}{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{sign}{:.0} MiB", b / KIB / KIB)
    } else {
        format!("{sign}{:.2} GiB", b / KIB / KIB / KIB)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn numbers_are_formatted_for_people() {
        assert_eq!(fmt_count(0), "0");
        assert_eq!(fmt_count(999), "999");
        assert_eq!(fmt_count(1000), "1,000");
        assert_eq!(fmt_count(1_234_567), "1,234,567");
        assert_eq!(fmt_duration(Duration::from_micros(420)), "0.42 ms");
        assert_eq!(fmt_duration(Duration::from_micros(12_345)), "12.3 ms");
        assert_eq!(fmt_duration(ms(1250)), "1.25 s");
    }

    #[test]
    fn bytes_are_written_in_binary_units() {
        assert_eq!(fmt_bytes(724.0), "724 B");
        assert_eq!(fmt_bytes(-300.0), "−300 B");
        assert_eq!(fmt_bytes(12_595.0), "12.3 KiB");
        assert_eq!(fmt_bytes(973.0 * 1024.0 * 1024.0), "973 MiB");
        assert_eq!(fmt_bytes(2.37 * 1024.0 * 1024.0 * 1024.0), "2.37 GiB");
    }
}
