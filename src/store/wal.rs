//! The write-ahead log: the commit thread appends each batch to it and syncs it before
//! any writer hears back; the checkpointer applies the batches to the redb file later,
//! many in one transaction (`checkpoint.rs`). A durable create costs one small synced
//! write at the end of one file instead of a redb commit, which syncs a handful of
//! scattered pages — as etcd appends each entry to its WAL and commits its bbolt backend
//! in batches.
//!
//! Two files beside the database, `<db>-wal-0` and `<db>-wal-1`, used in turn. Each
//! starts with a header naming its generation; records follow it back to back. When the
//! active file has no room for the next record, the other one becomes active under the
//! next generation, once every record in it is in redb. A record's checksum covers its
//! file's generation, so whatever an earlier use of the file left behind its end never
//! reads as a current record.
//!
//! ```text
//! header, HEADER bytes (zeros after the fields)
//!   0..8    magic "hive-wal"
//!   8..12   format version, u32 LE (1)
//!   12..20  generation, u64 LE
//!   20..24  CRC-32 of bytes 0..20
//! record
//!   0..4    n = length of the entry, u32 LE (0: no record here)
//!   4..8    CRC-32 of the generation (u64 LE), bytes 0..4 and the entry
//!   8..8+n  the entry (entry.rs)
//! ```
//!
//! The files grow in zero-filled steps up to their capacity and are never shortened, so
//! a sync after a record in them writes no file-system metadata once the file is as long
//! as it will be (a write past the end grows the file, and one into fallocated space
//! converts extents: both make the sync commit the file system's journal).
//!
//! Architecture Invariant: a record is written only after every record before it is
//! synced, and the records the log holds under the two current generations are one run of
//! consecutive revisions that continues the redb file's (the checkpointer applies them in
//! order, and a file is reused only once redb has all of its records).

use std::fs::{self, File};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::entry::Entry;
use super::error::{Error, Result};

/// The header block's size: records start here.
pub(super) const HEADER: u64 = 4096;

/// A record's length and checksum, before its entry.
pub(super) const RECORD_HEAD: usize = 8;

const MAGIC: &[u8; 8] = b"hive-wal";
const VERSION: u32 = 1;

/// The first zero-filled step of a new file; each later one doubles, up to `MAX_STEP`.
const FIRST_STEP: u64 = 64 << 10;
const MAX_STEP: u64 = 4 << 20;

/// The two files of the log of the database at `db`.
pub(super) fn paths(db: &Path) -> [PathBuf; 2] {
    [0, 1].map(|i| {
        let mut name = db.as_os_str().to_owned();
        name.push(format!("-wal-{i}"));
        PathBuf::from(name)
    })
}

/// The log, open for appending (the commit thread owns it).
pub(super) struct Wal {
    files: [LogFile; 2],
    /// Which file records go to.
    active: usize,
    /// Where the next record goes in the active file.
    offset: u64,
    /// The most a file grows to.
    capacity: u64,
    /// Tests set this to make the next append's sync fail after its write.
    #[cfg(test)]
    pub fail_sync: bool,
}

struct LogFile {
    file: File,
    path: PathBuf,
    generation: u64,
    /// The highest revision recorded in this file under its generation (0: none).
    last: u64,
    /// The file's length: zeros or records up to here.
    len: u64,
}

impl Wal {
    /// Opens (or creates) both files and starts them over under `generation` and the one
    /// after it, the second active: for after the store has applied everything they held
    /// to redb (see [`recover`]). `capacity` is each file's most.
    pub fn start(db: &Path, generation: u64, capacity: u64) -> Result<Wal> {
        let capacity = capacity.max(HEADER + FIRST_STEP);
        let open = |path: PathBuf| -> Result<LogFile> {
            let file = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&path)
                .map_err(|source| Error::Io { path: path.clone(), source })?;
            let len = file.metadata().map_err(|source| Error::Io { path: path.clone(), source })?.len();
            Ok(LogFile { file, path, generation: 0, last: 0, len })
        };
        let [a, b] = paths(db);
        let mut wal = Wal {
            files: [open(a)?, open(b)?],
            active: 1,
            offset: HEADER,
            capacity,
            #[cfg(test)]
            fail_sync: false,
        };
        wal.restart(generation).map_err(|(path, source)| Error::Io { path, source })?;
        // A new file's directory entry must be as durable as its contents.
        sync_dir(db)?;
        Ok(wal)
    }

    /// Starts both files over: the inactive one empty under `generation`, the active one
    /// under the next. Records either held before are no longer read.
    fn restart(&mut self, generation: u64) -> Result<(), (PathBuf, io::Error)> {
        for (i, generation) in [(0, generation), (1, generation + 1)] {
            self.files[i].begin(generation)?;
        }
        self.active = 1;
        self.offset = HEADER;
        Ok(())
    }

    /// Starts both files over under the next two generations: after a failed append,
    /// once redb holds every record the log acknowledged, so that nothing the failed
    /// append may have left is ever read.
    pub fn reset(&mut self) -> Result<(), (PathBuf, io::Error)> {
        let next = self.generation() + 1;
        self.restart(next)
    }

    /// The active file's generation.
    pub fn generation(&self) -> u64 {
        self.files[self.active].generation
    }

    /// The most an entry may be to fit in a file at all.
    pub fn max_entry(&self) -> usize {
        usize::try_from(self.capacity - HEADER).unwrap_or(usize::MAX) - RECORD_HEAD
    }

    /// Whether an entry of `len` bytes fits in the active file after its records.
    pub fn fits(&self, len: usize) -> bool {
        self.offset + (RECORD_HEAD + len) as u64 <= self.capacity
    }

    /// The highest revision recorded in the inactive file (0: none): redb must have it
    /// before that file is reused.
    pub fn inactive_last(&self) -> u64 {
        self.files[1 - self.active].last
    }

    /// Makes the inactive file the active one, empty, under the next generation. The
    /// caller has made sure redb holds every record that was in it.
    pub fn switch(&mut self) -> Result<(), (PathBuf, io::Error)> {
        let next = self.generation() + 1;
        let other = 1 - self.active;
        self.files[other].begin(next)?;
        self.active = other;
        self.offset = HEADER;
        Ok(())
    }

    /// Appends one record and syncs it. `record` is the record head's room
    /// (`RECORD_HEAD` bytes, filled in here) followed by the entry, whose last revision
    /// is `last`. The caller checked that it [`fits`](Wal::fits).
    pub fn append(&mut self, record: &mut [u8], last: u64) -> Result<(), (PathBuf, io::Error)> {
        debug_assert!(self.fits(record.len() - RECORD_HEAD));
        let capacity = self.capacity;
        let file = &mut self.files[self.active];
        seal(record, file.generation);
        let end = self.offset + record.len() as u64;
        file.grow_to(end, capacity)?;
        let io = |e| (file.path.clone(), e);
        file.file.write_all_at(record, self.offset).map_err(io)?;
        #[cfg(test)]
        if std::mem::take(&mut self.fail_sync) {
            return Err(io(io::Error::other("injected sync failure")));
        }
        file.file.sync_data().map_err(io)?;
        file.last = last;
        self.offset = end;
        Ok(())
    }

    /// After a failed append: zeroes the head of whatever it wrote, and syncs. A record
    /// whose sync failed may still reach the disk, and its writer was told it failed, so
    /// it must not be read back. Best effort: when this fails too, the log starts over
    /// before the next write anyway, but a crash before that could bring the record back.
    pub fn discard_failed(&mut self) -> Result<(), (PathBuf, io::Error)> {
        let file = &mut self.files[self.active];
        if self.offset + RECORD_HEAD as u64 > file.len {
            return Ok(());
        }
        let io = |e| (file.path.clone(), e);
        file.file.write_all_at(&[0; RECORD_HEAD], self.offset).map_err(io)?;
        file.file.sync_data().map_err(io)
    }
}

impl LogFile {
    /// Writes a header for `generation` (and syncs it): the file holds no record under it.
    fn begin(&mut self, generation: u64) -> Result<(), (PathBuf, io::Error)> {
        let path = self.path.clone();
        let io = |e| (path.clone(), e);
        let mut header = vec![0u8; HEADER as usize];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&VERSION.to_le_bytes());
        header[12..20].copy_from_slice(&generation.to_le_bytes());
        let crc = crc32fast::hash(&header[..20]);
        header[20..24].copy_from_slice(&crc.to_le_bytes());
        // A new file gets its first zero-filled step with the header.
        let first_step = (HEADER + FIRST_STEP).max(self.len);
        self.grow_to(first_step, first_step).map_err(|(_, e)| io(e))?;
        self.file.write_all_at(&header, 0).map_err(io)?;
        self.file.sync_data().map_err(io)?;
        self.generation = generation;
        self.last = 0;
        Ok(())
    }

    /// Makes the file at least `end` bytes long (at most `capacity`), in zero-filled
    /// steps that double with the file's length. Not synced here: the record written
    /// after it is, and with it the file's new length.
    fn grow_to(&mut self, end: u64, capacity: u64) -> Result<(), (PathBuf, io::Error)> {
        if end <= self.len {
            return Ok(());
        }
        let step = self.len.clamp(FIRST_STEP, MAX_STEP);
        let target = end.max(self.len + step).min(capacity.max(end));
        static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
        let mut at = self.len;
        while at < target {
            let n = (target - at).min(ZEROS.len() as u64) as usize;
            self.file.write_all_at(&ZEROS[..n], at).map_err(|e| (self.path.clone(), e))?;
            at += n as u64;
        }
        self.len = target;
        Ok(())
    }
}

/// Fills in a record's head: its entry's length and the checksum under `generation`.
fn seal(record: &mut [u8], generation: u64) {
    let len = u32::try_from(record.len() - RECORD_HEAD).expect("a record fits in a log file");
    record[..4].copy_from_slice(&len.to_le_bytes());
    let crc = checksum(generation, &record[..4], &record[RECORD_HEAD..]);
    record[4..8].copy_from_slice(&crc.to_le_bytes());
}

fn checksum(generation: u64, len: &[u8], entry: &[u8]) -> u32 {
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&generation.to_le_bytes());
    hasher.update(len);
    hasher.update(entry);
    hasher.finalize()
}

fn sync_dir(db: &Path) -> Result<()> {
    let dir = db.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    File::open(dir).and_then(|d| d.sync_all()).map_err(|source| Error::Io { path: dir.to_owned(), source })
}

/// What the log holds beyond a redb file at some revision.
#[derive(Debug, Default)]
pub(super) struct Recovered {
    /// The entries after that revision, in order, each as its bytes.
    pub entries: Vec<Vec<u8>>,
    /// The highest generation either file has (0 when neither has a header).
    pub generation: u64,
}

/// One file's records under its generation, read without trusting anything in it.
struct FileRecords {
    generation: u64,
    /// `(first, last, entry)` in file order.
    records: Vec<(u64, u64, Vec<u8>)>,
}

/// Reads the log of the database at `db` and returns the entries after `revision` (the
/// redb file's), checking that they continue it: consecutive revisions from
/// `revision + 1`, the older file's records before the newer one's. A record cut short
/// or damaged at the end of the newest file is where the log ends (a crash while it was
/// written: it was never acknowledged). Anything else that does not fit is `Corrupt`:
/// acknowledged writes would be lost. Missing files hold nothing.
pub(super) fn recover(db: &Path, revision: u64) -> Result<Recovered> {
    let mut files = Vec::new();
    for path in paths(db) {
        match File::open(&path) {
            Ok(file) => {
                if let Some(records) = read_file(file, &path, revision)? {
                    files.push((path, records));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Io { path, source }),
        }
    }
    files.sort_by_key(|(_, f)| f.generation);
    let mut recovered =
        Recovered { generation: files.last().map_or(0, |(_, f)| f.generation), ..Recovered::default() };
    let mut expected = revision + 1;
    for (path, file) in files {
        for (first, last, entry) in file.records {
            if last < expected {
                continue; // redb has it already
            }
            if first != expected {
                return Err(Error::corrupt(
                    path,
                    format!(
                        "the write-ahead log holds revisions {first}..={last} where revision {expected} comes next"
                    ),
                ));
            }
            expected = last + 1;
            recovered.entries.push(entry);
        }
    }
    Ok(recovered)
}

/// The highest revision the log of the database at `db` holds beyond `revision`, without
/// checking more than that it can be read: for `--reset-state`, whose new store must
/// continue above everything the old one acknowledged.
pub(super) fn last_revision(db: &Path, revision: u64) -> u64 {
    let mut last = revision;
    for path in paths(db) {
        let Ok(file) = File::open(&path) else { continue };
        if let Ok(Some(records)) = read_file(file, &path, revision) {
            last = records.records.iter().map(|r| r.1).fold(last, u64::max);
        }
    }
    last
}

/// One file's header and records. `None` when it has no valid header (never written, or
/// its header was cut short: then it held nothing yet). Entries at or below `after` are
/// checked but not kept.
fn read_file(file: File, path: &Path, after: u64) -> Result<Option<FileRecords>> {
    let io_err = |source| Error::Io { path: path.to_owned(), source };
    let len = file.metadata().map_err(io_err)?.len();
    let mut reader = io::BufReader::with_capacity(1 << 20, file);
    let mut header = [0u8; 24];
    if len < HEADER || reader.read_exact(&mut header).is_err() {
        return Ok(None);
    }
    let crc = u32::from_le_bytes(header[20..24].try_into().expect("4 bytes"));
    if &header[..8] != MAGIC || crc32fast::hash(&header[..20]) != crc {
        return Ok(None);
    }
    let version = u32::from_le_bytes(header[8..12].try_into().expect("4 bytes"));
    if version != VERSION {
        return Err(Error::corrupt(
            path,
            format!("write-ahead log format {version} (this build reads {VERSION})"),
        ));
    }
    let generation = u64::from_le_bytes(header[12..20].try_into().expect("8 bytes"));
    let mut skip = vec![0u8; (HEADER - 24) as usize];
    reader.read_exact(&mut skip).map_err(io_err)?;
    let mut out = FileRecords { generation, records: Vec::new() };
    let mut at = HEADER;
    loop {
        let mut head = [0u8; RECORD_HEAD];
        if at + RECORD_HEAD as u64 > len || reader.read_exact(&mut head).is_err() {
            break;
        }
        let n = u32::from_le_bytes(head[..4].try_into().expect("4 bytes")) as u64;
        if n == 0 {
            break;
        }
        if at + RECORD_HEAD as u64 + n > len {
            break;
        }
        let mut entry = vec![0u8; n as usize];
        reader.read_exact(&mut entry).map_err(io_err)?;
        let crc = u32::from_le_bytes(head[4..8].try_into().expect("4 bytes"));
        if checksum(generation, &head[..4], &entry) != crc {
            // A record cut short by a crash, or one an earlier use of the file left.
            break;
        }
        let decoded = Entry::decode(&entry)
            .map_err(|why| Error::corrupt(path, format!("write-ahead log record at byte {at}: {why}")))?;
        let (first, last) = (decoded.first, decoded.last);
        if out.records.last().is_some_and(|&(_, previous, _)| first != previous + 1) {
            return Err(Error::corrupt(
                path,
                format!("write-ahead log record at byte {at} has revisions {first}..={last} out of order"),
            ));
        }
        if last <= after {
            entry = Vec::new();
        }
        out.records.push((first, last, entry));
        at += RECORD_HEAD as u64 + n;
    }
    Ok(Some(out))
}

/// Removes both files of the log of the database at `db` (for `--reset-state`).
pub(super) fn remove(db: &Path) -> Result<()> {
    for path in paths(db) {
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(Error::Io { path, source: e }),
            _ => {}
        }
    }
    Ok(())
}
