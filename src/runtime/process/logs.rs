//! The agent's rotating output log: stdout and stderr of the agent process, appended to
//! `logs/agent.log`; when a write would pass the size bound, the file is shifted to
//! `agent.log.1` (`.1` to `.2`, …) and a fresh one started, so disk use stays under
//! `files × max_bytes`. Each line is stored with its time and stream, and each run's
//! start is marked (`log_format.rs`); [`stream`] selects and renders from that.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use super::log_format::{NoPreviousRun, Renderer};
use crate::runtime::{LogOptions, LogStream};

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

/// How often a followed log looks for what was appended.
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// The agent's output in `dir` as [`Runtime::logs`](crate::runtime::Runtime::logs)
/// serves it: every file oldest first, selected and rendered by `options` (the previous
/// run, since a time, the last `tail` lines, with timestamps), then with `follow` what is
/// appended to the live file. The live file is followed through an open handle, so a
/// rotation loses nothing: the renamed file is read to its end before the new live file
/// is opened. The previous run is finished, so it is never followed.
pub async fn stream(dir: &Path, options: LogOptions) -> Result<LogStream, NoPreviousRun> {
    use tokio::io::AsyncReadExt;
    let live = dir.join(LOG_FILE);
    let mut stored = Vec::new();
    for file in log_files(dir).iter().filter(|f| **f != live) {
        if let Ok(bytes) = tokio::fs::read(file).await {
            stored.extend_from_slice(&bytes);
        }
    }
    let mut handle = tokio::fs::File::open(&live).await.ok();
    if let Some(file) = &mut handle {
        let _ = file.read_to_end(&mut stored).await;
    }
    let mut renderer = Renderer::new(&options);
    let text = renderer.select(&stored, &options)?;
    let follow = options.follow && !options.previous;
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(16);
    tokio::spawn(async move {
        if tx.send(bytes::Bytes::from(text)).await.is_err() || !follow {
            return;
        }
        loop {
            tokio::select! {
                _ = tokio::time::sleep(FOLLOW_POLL) => {}
                _ = tx.closed() => return,
            }
            // Drain the file we hold (renamed or not), then move on to a new live file.
            let mut chunk = Vec::new();
            if let Some(file) = &mut handle {
                let _ = file.read_to_end(&mut chunk).await;
            }
            if is_rotated(handle.as_ref(), &live).await {
                handle = tokio::fs::File::open(&live).await.ok();
                if let Some(file) = &mut handle {
                    let _ = file.read_to_end(&mut chunk).await;
                }
            }
            let shown = renderer.follow(&chunk);
            if !shown.is_empty() && tx.send(bytes::Bytes::from(shown)).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// Whether `path` is no longer the file `held` (rotated away, or created since).
async fn is_rotated(held: Option<&tokio::fs::File>, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let Ok(now) = tokio::fs::metadata(path).await else { return false };
    match held {
        None => true,
        Some(file) => file.metadata().await.map_or(true, |m| (m.dev(), m.ino()) != (now.dev(), now.ino())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::process::log_format::{encode, Stream};

    fn entries(text: &str) -> Vec<u8> {
        encode(crate::host::now(), Stream::Stdout, text.as_bytes())
    }

    /// What `hive logs agent/x --tail 2 -f` sees: the last lines across a rotation, then
    /// what is appended, also after the live file rotates again.
    #[tokio::test(start_paused = true)]
    async fn a_stream_tails_across_rotations_then_follows() {
        let dir = tempfile::tempdir().unwrap();
        // Room for two entries of 45 bytes per file.
        let mut log = RotatingLog::open(dir.path(), 90, 3).unwrap();
        log.write(&entries("one\ntwo\n")).unwrap();
        log.write(&entries("three\n")).unwrap();
        let options = LogOptions { follow: true, tail: Some(2), ..LogOptions::default() };
        let mut rx = stream(dir.path(), options).await.unwrap();
        assert_eq!(rx.recv().await.unwrap(), "two\nthree\n");
        log.write(&entries("four\n")).unwrap();
        assert_eq!(rx.recv().await.unwrap(), "four\n");
        log.write(&entries("fives\n")).unwrap(); // past the bound: the live file starts over
        assert_eq!(rx.recv().await.unwrap(), "fives\n");

        let mut all = stream(dir.path(), LogOptions::default()).await.unwrap();
        // Three files of at most two entries: the oldest lines are gone.
        assert_eq!(all.recv().await.unwrap(), "three\nfour\nfives\n");
        assert!(all.recv().await.is_none(), "without follow the stream ends");
    }

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
