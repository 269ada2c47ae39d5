//! What systemd says of a container's unit: `systemctl show
//! --property=ActiveState,MainPID,ActiveEnterTimestamp container@<c>`, parsed.

use chrono::{DateTime, NaiveDateTime, Utc};
use hive_api::agent::Power;

/// The properties of `container@<c>.service` the driver reads.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnitState {
    /// `ActiveState`: `active`, `reloading`, `inactive`, `failed`, `activating`,
    /// `deactivating`, … (empty when systemd did not say).
    pub active_state: String,
    /// `MainPID`: the `systemd-nspawn` process, 0 when there is none.
    pub main_pid: u32,
    /// `ActiveEnterTimestamp`: when the unit last became active.
    pub active_enter: Option<DateTime<Utc>>,
}

impl UnitState {
    /// Parses `KEY=value` lines; unknown keys and malformed values are ignored.
    pub fn parse(text: &str) -> UnitState {
        let mut state = UnitState::default();
        for line in text.lines() {
            let Some((key, value)) = line.split_once('=') else { continue };
            let value = value.trim();
            match key.trim() {
                "ActiveState" => state.active_state = value.to_string(),
                "MainPID" => state.main_pid = value.parse().unwrap_or(0),
                "ActiveEnterTimestamp" => state.active_enter = timestamp(value),
                _ => {}
            }
        }
        state
    }

    /// True while the container runs (`active`, or `reloading` a live configuration).
    pub fn running(&self) -> bool {
        matches!(self.active_state.as_str(), "active" | "reloading")
    }

    /// The power state the unit's `ActiveState` amounts to.
    pub fn power(&self) -> Power {
        match self.active_state.as_str() {
            "active" | "reloading" => Power::Running,
            "activating" => Power::Starting,
            "deactivating" => Power::Stopping,
            "inactive" | "failed" | "maintenance" => Power::Stopped,
            _ => Power::Unknown,
        }
    }

    /// The main pid while running.
    pub fn pid(&self) -> Option<u32> {
        (self.running() && self.main_pid != 0).then_some(self.main_pid)
    }
}

/// A systemd timestamp as `systemctl show` prints it under `TZ=UTC` and `LC_ALL=C`
/// (`Sun 2026-11-29 17:55:28 UTC`), or with `--timestamp=unix` (`@1795974928`); empty
/// and `n/a` are none.
pub fn timestamp(value: &str) -> Option<DateTime<Utc>> {
    if let Some(seconds) = value.strip_prefix('@') {
        return DateTime::from_timestamp(seconds.parse().ok()?, 0);
    }
    let local = value.strip_suffix(" UTC")?;
    let naive = NaiveDateTime::parse_from_str(local, "%a %Y-%m-%d %H:%M:%S").ok()?;
    Some(naive.and_utc())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ActiveState MainPID ActiveEnterTimestamp running power`, as the driver reads them.
    fn render(state: &UnitState) -> String {
        let since = state.active_enter.map_or("-".to_string(), |t| t.to_rfc3339());
        format!("{:?} {} {since} {} {:?}", state.active_state, state.main_pid, state.running(), state.power())
    }

    #[test]
    fn show_output_parses() {
        let cases: &[(&str, &str)] = &[
            (
                "ActiveState=active\nMainPID=4242\nActiveEnterTimestamp=Sun 2026-11-29 17:55:28 UTC\n",
                r#""active" 4242 2026-11-29T17:55:28+00:00 true Running"#,
            ),
            ("MainPID=0\nActiveState=inactive\nActiveEnterTimestamp=\n", r#""inactive" 0 - false Stopped"#),
            ("ActiveState=failed\nMainPID=0\nActiveEnterTimestamp=n/a\n", r#""failed" 0 - false Stopped"#),
            (
                "ActiveState=activating\nMainPID=17\nActiveEnterTimestamp=@1795974928\n",
                r#""activating" 17 2026-11-29T17:55:28+00:00 false Starting"#,
            ),
            ("ActiveState=reloading\nMainPID=9\n", r#""reloading" 9 - true Running"#),
            ("ActiveState=deactivating\nMainPID=x\n", r#""deactivating" 0 - false Stopping"#),
            ("ActiveEnterTimestamp=Sun 2026-11-29 17:55:28 CET\n", r#""" 0 - false Unknown"#),
            ("", r#""" 0 - false Unknown"#),
        ];
        for (text, want) in cases {
            assert_eq!(render(&UnitState::parse(text)), *want, "{text:?}");
        }
    }
}
