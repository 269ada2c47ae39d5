//! Ages as kubectl prints them (`HumanDuration`): the server's Table cells and the
//! CLI's own columns share this one rendering.

use chrono::{DateTime, Utc};

/// kubectl's `HumanDuration`: `45s`, `3m20s`, `25m`, `5h3m`, `12h`, `3d4h`, `40d`, `2y3d`.
pub fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        let s = seconds % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{h}h", hours / 24) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let days = (hours / 24) % 365;
        return if days == 0 {
            format!("{}y", hours / 24 / 365)
        } else {
            format!("{}y{days}d", hours / 24 / 365)
        };
    }
    format!("{}y", hours / 24 / 365)
}

/// The age of an RFC 3339 timestamp at `now`, or `<unknown>`.
pub fn age(timestamp: Option<&str>, now: DateTime<Utc>) -> String {
    match timestamp.and_then(|t| DateTime::parse_from_rfc3339(t).ok()) {
        Some(t) => human_duration((now - t.with_timezone(&Utc)).num_seconds()),
        None => "<unknown>".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_durations_match_kubectl() {
        let cases = [
            (-5, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (119, "119s"),
            (120, "2m"),
            (200, "3m20s"),
            (600, "10m"),
            (179 * 60, "179m"),
            (3 * 3600, "3h"),
            (5 * 3600 + 3 * 60, "5h3m"),
            (47 * 3600, "47h"),
            (3 * 86400 + 4 * 3600, "3d4h"),
            (5 * 86400, "5d"),
            (40 * 86400, "40d"),
            (2 * 365 * 86400 + 3 * 86400, "2y3d"),
            (9 * 365 * 86400, "9y"),
        ];
        for (secs, text) in cases {
            assert_eq!(human_duration(secs), text, "{secs}");
        }
    }
}
