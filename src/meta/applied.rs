//! Applied-rev markers: per agent, the config commit and hive base rev its running
//! generation was built from (`<state-dir>/applied/<agent>.json`), written after every
//! successful swap, create or approval deploy. The boot sweep compares them with the
//! current lock to find stale agents, as the coordinator document's
//! `.{name}.hyperhive-rev` markers do.

use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// What an agent's current generation was built from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Marker {
    /// The config commit (full sha).
    pub rev: String,
    /// The hive base input's rev at the time.
    pub hive: String,
}

/// The marker directory.
#[derive(Clone, Debug)]
pub struct Markers {
    dir: PathBuf,
}

impl Markers {
    /// Markers kept in `dir` (created on first write).
    pub fn new(dir: impl Into<PathBuf>) -> Markers {
        Markers { dir: dir.into() }
    }

    fn path(&self, agent: &str) -> PathBuf {
        self.dir.join(format!("{agent}.json"))
    }

    /// The agent's marker; `None` when it has none or it does not parse (a torn or
    /// foreign file counts as stale, which at worst costs one rebuild).
    pub fn read(&self, agent: &str) -> Option<Marker> {
        let bytes = std::fs::read(self.path(agent)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Records the agent's marker (temp file + rename, both synced: the boot sweep after
    /// a power cut reads what the last acknowledged deploy wrote).
    pub fn write(&self, agent: &str, marker: &Marker) -> io::Result<()> {
        let bytes = serde_json::to_vec(marker).expect("a marker serializes");
        crate::durable::write_atomic(&self.path(agent), &bytes, 0o644)
    }

    /// Every agent that has a marker file (one directory read; whether each parses is
    /// for [`Markers::read`] to say).
    pub fn names(&self) -> std::collections::HashSet<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Default::default() };
        entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.strip_suffix(".json").map(str::to_string))
            .collect()
    }

    /// Removes a deleted agent's marker.
    pub fn remove(&self, agent: &str) {
        let _ = crate::durable::remove_file(&self.path(agent));
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_round_trip_and_garbage_reads_as_none() {
        let dir = tempfile::tempdir().unwrap();
        let markers = Markers::new(dir.path().join("applied"));
        assert_eq!(markers.read("a"), None);
        let marker = Marker { rev: "abc".into(), hive: "0.1.0".into() };
        markers.write("a", &marker).unwrap();
        assert_eq!(markers.read("a"), Some(marker));
        std::fs::write(dir.path().join("applied/a.json"), b"{torn").unwrap();
        assert_eq!(markers.read("a"), None);
        assert_eq!(markers.names(), ["a".to_string()].into());
        markers.remove("a");
        assert!(!dir.path().join("applied/a.json").exists());
    }

    #[test]
    fn a_marker_is_on_disk_before_write_returns() {
        let dir = tempfile::tempdir().unwrap();
        let markers = Markers::new(dir.path().join("applied"));
        crate::durable::synced::take();
        markers.write("a", &Marker { rev: "abc".into(), hive: "0.1.0".into() }).unwrap();
        let synced = crate::durable::synced::take();
        // The new directory in the state dir, and the rename in the new directory (the
        // file itself is synced before the rename, by `durable::write_atomic`).
        for dir in [dir.path().to_path_buf(), dir.path().join("applied")] {
            assert!(synced.contains(&dir), "{} not synced: {synced:?}", dir.display());
        }
    }
}
