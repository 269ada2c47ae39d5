//! The agent's rotating output log: stdout and stderr of the agent process, appended to
//! `logs/agent.log`; when a write would pass the size bound, the file is shifted to
//! `agent.log.1` (`.1` to `.2`, …) and a fresh one started, so disk use stays under
//! `files × max_bytes`. Each line is stored with its time and stream, and each run's
//! start is marked (`log_format.rs`); `log_reader.rs` selects and renders from that.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Name of the live log file inside an agent's `logs/` directory.
pub const LOG_FILE: &str = "agent.log";

/// An append-only log file with size-bounded rotation.
#[derive(Debug)]
pub struct RotatingLog {
    dir: PathBuf,
    max_bytes: u64,
    files: usize,
    file: File,
    size: u64,
}

impl RotatingLog {
    /// Opens (creating it and `dir` if needed) the live log in `dir`, keeping at most
    /// `files` files (the live one included, at least 1) of at most `max_bytes` each.
    pub fn open(dir: &Path, max_bytes: u64, files: usize) -> io::Result<RotatingLog> {
        fs::create_dir_all(dir)?;
        let path = dir.join(LOG_FILE);
        let file = OpenOptions::new().create(true).append(true).open(&path)?;
        let size = file.metadata()?.len();
        Ok(RotatingLog {
            dir: dir.to_path_buf(),
            max_bytes: max_bytes.max(1),
            files: files.max(1),
            file,
            size,
        })
    }

    /// Appends `bytes`, rotating first whenever they would not fit in the live file;
    /// a chunk larger than the bound is split across files, after a newline when one
    /// fits.
    pub fn write(&mut self, mut bytes: &[u8]) -> io::Result<()> {
        while !bytes.is_empty() {
            if self.size >= self.max_bytes {
                self.rotate()?;
            }
            let room = (self.max_bytes - self.size) as usize;
            if bytes.len() > room && self.size > 0 {
                self.rotate()?;
                continue;
            }
            let mut take = bytes.len().min(room);
            if take < bytes.len() {
                // Cut after a whole line when one fits, so each file starts with an entry.
                if let Some(end) = bytes[..take].iter().rposition(|b| *b == b'\n') {
                    take = end + 1;
                }
            }
            let (now, rest) = bytes.split_at(take);
            self.file.write_all(now)?;
            self.size += now.len() as u64;
            bytes = rest;
        }
        Ok(())
    }

    /// Shifts `agent.log.N` to `.N+1` (dropping the oldest) and starts a new live file.
    fn rotate(&mut self) -> io::Result<()> {
        let keep = self.files - 1;
        if keep == 0 {
            self.file.set_len(0)?;
            self.size = 0;
            return Ok(());
        }
        let _ = fs::remove_file(self.dir.join(format!("{LOG_FILE}.{keep}")));
        for n in (1..keep).rev() {
            let from = self.dir.join(format!("{LOG_FILE}.{n}"));
            if from.exists() {
                fs::rename(&from, self.dir.join(format!("{LOG_FILE}.{}", n + 1)))?;
            }
        }
        let live = self.dir.join(LOG_FILE);
        fs::rename(&live, self.dir.join(format!("{LOG_FILE}.1")))?;
        self.file = OpenOptions::new().create(true).append(true).open(&live)?;
        self.size = 0;
        Ok(())
    }
}

/// The log files in `dir`, oldest first (rotated ones, then the live one); what
/// `hive logs agent/NAME` reads.
pub fn log_files(dir: &Path) -> Vec<PathBuf> {
    let mut rotated: Vec<(u32, PathBuf)> = fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let n = name.strip_prefix(LOG_FILE)?.strip_prefix('.')?.parse().ok()?;
            Some((n, entry.path()))
        })
        .collect();
    rotated.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    let mut files: Vec<PathBuf> = rotated.into_iter().map(|(_, path)| path).collect();
    let live = dir.join(LOG_FILE);
    if live.exists() {
        files.push(live);
    }
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_keeps_the_bound_and_the_newest_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RotatingLog::open(dir.path(), 10, 2).unwrap();
        for i in 0..7u8 {
            log.write(&[b'a' + i; 4]).unwrap();
        }
        let files = log_files(dir.path());
        assert_eq!(files.len(), 2, "{files:?}");
        let contents: Vec<String> = files.iter().map(|f| fs::read_to_string(f).unwrap()).collect();
        // 28 bytes in chunks of 4 into files of 10: the two newest files hold the tail.
        assert_eq!(contents, ["eeeeffff", "gggg"]);
        for file in &files {
            assert!(fs::metadata(file).unwrap().len() <= 10);
        }
    }

    #[test]
    fn an_oversized_chunk_is_split_and_reopen_appends() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RotatingLog::open(dir.path(), 4, 3).unwrap();
        log.write(b"0123456789").unwrap();
        drop(log);
        let mut log = RotatingLog::open(dir.path(), 4, 3).unwrap();
        log.write(b"x").unwrap();
        let contents: Vec<String> =
            log_files(dir.path()).iter().map(|f| fs::read_to_string(f).unwrap()).collect();
        assert_eq!(contents, ["0123", "4567", "89x"]);
    }
}
