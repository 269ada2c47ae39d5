//! Reading an agent's log as [`Runtime::logs`](crate::runtime::Runtime::logs) serves it,
//! in bounded memory whatever the log's size: the files are opened once (a rotation
//! after that loses nothing: an open handle follows its renamed file) and read as one
//! sequence of bytes, oldest first, in chunks of [`CHUNK`]. What is shown starts where
//! the options say — the previous run's first line, the first line at or after `since`,
//! the first of the last `tail` lines — found by reading backwards from the end, so
//! `tail=1` of a large log reads one chunk or two, not the log. From there each chunk is
//! rendered and sent as the client takes it (the channel holds [`QUEUED`] chunks), then,
//! with `follow`, what is appended to the live file: read when the agent's supervisor
//! says it appended (a `watch` it ticks after each write), and every `FOLLOW_POLL`
//! in any case, for a rotation and for a writer that does not tick.

use std::io::SeekFrom;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::watch;

use super::log_format::{self, Entry, NoPreviousRun, Renderer, Stream};
use super::logs::{log_files, LOG_FILE};
use crate::runtime::{LogOptions, LogStream};

/// The most bytes read from the files at once.
pub const CHUNK: usize = 64 * 1024;

/// Rendered chunks queued for the client: with [`CHUNK`], what one reader holds beyond
/// the chunk being read is at most this many times 64 KiB (a rendered chunk is never
/// larger than the stored one, timestamps or not).
pub const QUEUED: usize = 4;

/// How often a followed log looks for what was appended when nothing said it was. A
/// line used to wait for this poll: half of it on average, all of it at p99 (`hive
/// bench --phases placement`, docs/benchmarks.md).
const FOLLOW_POLL: std::time::Duration = std::time::Duration::from_millis(250);

/// Of an entry read backwards, only the start is kept: its time, stream and tag.
const HEAD: usize = 96;

/// The log's files, opened, as one sequence of bytes (oldest first), as long as each was
/// when opened.
struct Files {
    parts: Vec<(tokio::fs::File, u64)>,
    /// The live file's index in `parts`, when it exists.
    live: Option<usize>,
}

impl Files {
    async fn open(dir: &Path) -> Files {
        let live_path = dir.join(LOG_FILE);
        let mut parts = Vec::new();
        let mut live = None;
        for path in log_files(dir) {
            let Ok(file) = tokio::fs::File::open(&path).await else { continue };
            let Ok(meta) = file.metadata().await else { continue };
            if path == live_path {
                live = Some(parts.len());
            }
            parts.push((file, meta.len()));
        }
        Files { parts, live }
    }

    fn len(&self) -> u64 {
        self.parts.iter().map(|(_, len)| len).sum()
    }

    /// Up to `buf.len()` bytes from `pos`, across files (fewer only at the sequence's
    /// end, or when a file cannot be read).
    async fn read_at(&mut self, pos: u64, buf: &mut [u8]) -> usize {
        let mut got = 0;
        while got < buf.len() {
            let n = self.read_in_part(pos + got as u64, &mut buf[got..]).await;
            if n == 0 {
                break;
            }
            got += n;
        }
        got
    }

    /// Up to `buf.len()` bytes from `pos`, within the file that holds `pos`.
    async fn read_in_part(&mut self, mut pos: u64, buf: &mut [u8]) -> usize {
        for (file, len) in &mut self.parts {
            if pos >= *len {
                pos -= *len;
                continue;
            }
            let want = buf.len().min((*len - pos) as usize);
            if file.seek(SeekFrom::Start(pos)).await.is_err() {
                return 0;
            }
            let mut got = 0;
            while got < want {
                match file.read(&mut buf[got..want]).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            return got;
        }
        0
    }

    /// The live file, positioned at its end as it was when opened, to follow.
    async fn into_live(mut self) -> Option<tokio::fs::File> {
        let (mut file, len) = self.parts.swap_remove(self.live?);
        file.seek(SeekFrom::Start(len)).await.ok()?;
        Some(file)
    }
}

/// One entry found reading backwards: its head and where its line starts and ends (after
/// its newline).
struct Found {
    stream: Stream,
    partial: bool,
    at: Option<chrono::DateTime<chrono::Utc>>,
    start: u64,
    end: u64,
}

/// Reads the entries of `files` before `end` from the last one back, handing each to
/// `visit` until it says stop (`true`); memory is one chunk and an entry's head.
async fn scan_back(files: &mut Files, end: u64, mut visit: impl FnMut(&Found) -> bool) {
    let mut pos = end;
    // The start of the line that continues past `pos` (its bytes up to HEAD), and where
    // that line ends.
    let mut head: Vec<u8> = Vec::new();
    let mut line_end = end;
    let mut block = vec![0u8; CHUNK];
    // An entry is complete with its newline: bytes after the last one (a write still
    // under way) are not an entry yet, as the renderer holds them back too.
    let mut torn = true;
    let emit = |head: &[u8], start: u64, end: u64, visit: &mut dyn FnMut(&Found) -> bool| {
        let text = head.strip_suffix(b"\n").unwrap_or(head);
        let Entry { at, stream, partial, .. } = log_format::parse(text);
        visit(&Found { stream, partial, at, start, end })
    };
    while pos > 0 {
        let from = pos.saturating_sub(CHUNK as u64);
        let want = (pos - from) as usize;
        let got = files.read_at(from, &mut block[..want]).await;
        if got < want {
            return; // a file shrank or failed under us: show what was found
        }
        let bytes = &block[..want];
        if pos == end && bytes.last() == Some(&b'\n') {
            torn = false;
        }
        // Newlines in this block, last first; the bytes after each start a line.
        let mut cut = want;
        for nl in memchr::memrchr_iter(b'\n', bytes) {
            let line_start = from + nl as u64 + 1;
            if std::mem::take(&mut torn) {
                // the bytes after the last newline
            } else if line_start < line_end {
                let mut line = bytes[nl + 1..cut].to_vec();
                line.truncate(HEAD);
                if line.len() < HEAD {
                    line.extend_from_slice(&head[..head.len().min(HEAD - line.len())]);
                }
                if emit(&line, line_start, line_end, &mut visit) {
                    return;
                }
            }
            line_end = line_start;
            cut = nl;
            head.clear();
        }
        let mut start = bytes[..cut].to_vec();
        start.truncate(HEAD);
        if start.len() < HEAD {
            start.extend_from_slice(&head[..head.len().min(HEAD - start.len())]);
        }
        head = start;
        pos = from;
    }
    if line_end > 0 && !head.is_empty() && !torn {
        emit(&head, 0, line_end, &mut visit);
    }
}

/// Where what `options` shows starts and ends in `files` (of `len` bytes).
async fn region(files: &mut Files, len: u64, options: &LogOptions) -> Result<(u64, u64), NoPreviousRun> {
    let (mut start, end) = if options.previous {
        // The run before the last: between the last two `run` marks, or, when the
        // retained log holds one mark, what comes before it.
        let mut found = Vec::new();
        scan_back(files, len, |entry| {
            if entry.stream == Stream::Run {
                found.push((entry.start, entry.end));
            }
            found.len() == 2
        })
        .await;
        match found.as_slice() {
            [] => return Err(NoPreviousRun),
            [(0, _)] => return Err(NoPreviousRun),
            [(last, _)] => (0, *last),
            [(last, _), (_, before_end), ..] => (*before_end, *last),
        }
    } else {
        (0, len)
    };
    let since = options.since;
    let shown = |entry: &Found| {
        entry.stream != Stream::Run && since.is_none_or(|since| entry.at.is_some_and(|at| at >= since))
    };
    if let Some(n) = options.tail {
        // The last `n` lines: each shown `F` entry ends one, and a shown `P` at the very
        // end is a line too (the output's last, without its newline).
        let (mut count, mut first, mut from) = (0usize, true, start);
        scan_back(files, end, |entry| {
            if entry.start < start {
                return true;
            }
            if !shown(entry) {
                return false;
            }
            let boundary = !entry.partial || first;
            first = false;
            if boundary {
                if count == n {
                    from = entry.end;
                    return true;
                }
                count += 1;
            }
            false
        })
        .await;
        start = from;
    } else if let Some(since) = since {
        // Skip what was written before `since` without rendering it: entries are in
        // time order, so the first one at or after it starts the output.
        let mut from = start;
        scan_back(files, end, |entry| {
            if entry.start < start || entry.at.is_some_and(|at| at < since) {
                return true;
            }
            from = entry.start;
            false
        })
        .await;
        start = from;
    }
    Ok((start, end))
}

/// The agent's output in `dir`, selected and rendered by `options` (see the module's
/// note); with `follow` (and not `previous`), what is appended to the live file after,
/// looked for whenever `appended` ticks.
pub async fn stream(
    dir: &Path,
    options: LogOptions,
    appended: watch::Receiver<()>,
) -> Result<LogStream, NoPreviousRun> {
    let mut files = Files::open(dir).await;
    let len = files.len();
    let (start, end) = region(&mut files, len, &options).await?;
    let follow = options.follow && !options.previous;
    let live_path = dir.join(LOG_FILE);
    let (tx, rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(QUEUED);
    tokio::spawn(async move {
        let mut renderer = Renderer::new(&options);
        let mut buf = vec![0u8; CHUNK];
        let mut pos = start;
        while pos < end {
            let want = CHUNK.min((end - pos) as usize);
            let got = files.read_at(pos, &mut buf[..want]).await;
            if got == 0 {
                break;
            }
            pos += got as u64;
            let shown = renderer.follow(&buf[..got]);
            if !shown.is_empty() && tx.send(bytes::Bytes::from(shown)).await.is_err() {
                return;
            }
        }
        if follow {
            let handle = files.into_live().await;
            follow_live(handle, &live_path, renderer, buf, appended, tx).await;
        }
    });
    Ok(rx)
}

/// Sends what is appended to the live file through `handle` (opened when it did not
/// exist), rendered, until the reader goes away. A rotation loses nothing: the renamed
/// file is read to its end before the new live file is opened.
async fn follow_live(
    mut handle: Option<tokio::fs::File>,
    live: &PathBuf,
    mut renderer: Renderer,
    mut buf: Vec<u8>,
    mut appended: watch::Receiver<()>,
    tx: tokio::sync::mpsc::Sender<bytes::Bytes>,
) {
    // A tick since the caller subscribed (before the files were opened) wakes the first
    // turn at once; a writer gone leaves the poll.
    let mut ticking = true;
    loop {
        tokio::select! {
            changed = appended.changed(), if ticking => ticking = changed.is_ok(),
            _ = tokio::time::sleep(FOLLOW_POLL) => {}
            _ = tx.closed() => return,
        }
        // Drain the file we hold (renamed or not), then move on to a new live file.
        if !drain(handle.as_mut(), &mut renderer, &mut buf, &tx).await {
            return;
        }
        if is_rotated(handle.as_ref(), live).await {
            handle = tokio::fs::File::open(live).await.ok();
            if !drain(handle.as_mut(), &mut renderer, &mut buf, &tx).await {
                return;
            }
        }
    }
}

/// Reads `file` to its end a chunk at a time, sending what each shows; false when the
/// reader went away.
async fn drain(
    file: Option<&mut tokio::fs::File>,
    renderer: &mut Renderer,
    buf: &mut [u8],
    tx: &tokio::sync::mpsc::Sender<bytes::Bytes>,
) -> bool {
    let Some(file) = file else { return true };
    loop {
        let got = match file.read(buf).await {
            Ok(0) | Err(_) => return true,
            Ok(n) => n,
        };
        let shown = renderer.follow(&buf[..got]);
        if !shown.is_empty() && tx.send(bytes::Bytes::from(shown)).await.is_err() {
            return false;
        }
    }
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
    use crate::runtime::process::log_format::encode;
    use crate::runtime::process::logs::RotatingLog;

    fn at(second: u32) -> chrono::DateTime<chrono::Utc> {
        chrono::DateTime::parse_from_rfc3339(&format!(
            "2026-12-01T17:{:02}:{:02}.000000001Z",
            second / 60,
            second % 60
        ))
        .unwrap()
        .to_utc()
    }

    fn entries(text: &str) -> Vec<u8> {
        encode(crate::host::now(), Stream::Stdout, text.as_bytes())
    }

    /// No supervisor ticks: a follower polls.
    fn quiet() -> watch::Receiver<()> {
        watch::channel(()).1
    }

    async fn read_all(mut rx: LogStream) -> String {
        let mut out = Vec::new();
        while let Some(chunk) = rx.recv().await {
            assert!(chunk.len() <= CHUNK, "a chunk of {} bytes", chunk.len());
            out.extend_from_slice(&chunk);
        }
        String::from_utf8(out).unwrap()
    }

    /// What the renderer shows of the whole log at once: the reference the streamed,
    /// region-selected answer must equal.
    fn reference(bytes: &[u8], options: &LogOptions) -> Result<String, NoPreviousRun> {
        Renderer::new(options).select(bytes, options).map(|out| String::from_utf8(out).unwrap())
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
        let mut rx = stream(dir.path(), options, quiet()).await.unwrap();
        assert_eq!(rx.recv().await.unwrap(), "two\nthree\n");
        log.write(&entries("four\n")).unwrap();
        assert_eq!(rx.recv().await.unwrap(), "four\n");
        log.write(&entries("fives\n")).unwrap(); // past the bound: the live file starts over
        assert_eq!(rx.recv().await.unwrap(), "fives\n");

        let mut all = stream(dir.path(), LogOptions::default(), quiet()).await.unwrap();
        // Three files of at most two entries: the oldest lines are gone.
        assert_eq!(all.recv().await.unwrap(), "three\nfour\nfives\n");
        assert!(all.recv().await.is_none(), "without follow the stream ends");
    }

    /// Every selection of a log spread over rotated files, with entries cut across
    /// chunks, partial lines and run marks, equals what rendering the whole log shows.
    #[tokio::test]
    async fn streamed_selections_equal_the_whole_log_rendered() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RotatingLog::open(dir.path(), 60_000, 4).unwrap();
        let mut all = Vec::new();
        let mut write = |bytes: Vec<u8>| {
            log.write(&bytes).unwrap();
            all.extend_from_slice(&bytes);
        };
        for i in 0..6000u32 {
            let stream = if i % 7 == 0 { Stream::Stderr } else { Stream::Stdout };
            if i % 1000 == 0 {
                write(encode(at(i / 20), Stream::Run, format!("pid {i}").as_bytes()));
            }
            let text = match i % 13 {
                0 => format!("piece {i} without its end "),
                5 => format!("{}\n", "x".repeat(300 + i as usize % 200)),
                _ => format!("line {i}\n"),
            };
            write(encode(at(i / 20), stream, text.as_bytes()));
        }
        write(encode(at(301), Stream::Stdout, b"trailing piece"));
        let files = log_files(dir.path());
        assert!(files.len() > 1, "the log rotated");
        let kept: Vec<u8> = files.iter().flat_map(|f| std::fs::read(f).unwrap()).collect();
        assert!(kept.len() < all.len(), "the oldest lines were rotated away");

        let default = LogOptions::default();
        let mut cases = vec![default, LogOptions { previous: true, ..default }];
        for n in [0, 1, 2, 3, 50, 1000, 100_000] {
            cases.push(LogOptions { tail: Some(n), ..default });
            cases.push(LogOptions { tail: Some(n), previous: true, ..default });
            cases.push(LogOptions { tail: Some(n), since: Some(at(250)), timestamps: true, ..default });
        }
        for since in [0, 100, 250, 299, 301, 400] {
            cases.push(LogOptions { since: Some(at(since)), ..default });
        }
        for options in cases {
            let want = reference(&kept, &options);
            let got = match stream(dir.path(), options, quiet()).await {
                Ok(rx) => Ok(read_all(rx).await),
                Err(e) => Err(e),
            };
            assert!(
                got == want,
                "{options:?}: {} bytes streamed, {} expected",
                got.map_or(0, |s| s.len()),
                want.map_or(0, |s| s.len())
            );
        }
    }

    /// A line is sent when the supervisor says it appended it, not at the next poll.
    #[tokio::test(start_paused = true)]
    async fn a_followed_line_is_sent_when_its_append_ticks() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RotatingLog::open(dir.path(), 1 << 20, 1).unwrap();
        log.write(&entries("before\n")).unwrap();
        let (appended, ticks) = watch::channel(());
        let options = LogOptions { follow: true, tail: Some(0), ..LogOptions::default() };
        let mut rx = stream(dir.path(), options, ticks).await.unwrap();
        for line in ["one\n", "two\n"] {
            tokio::time::sleep(FOLLOW_POLL / 10).await;
            let written = tokio::time::Instant::now();
            log.write(&entries(line)).unwrap();
            appended.send_replace(());
            assert_eq!(rx.recv().await.unwrap(), line);
            assert!(written.elapsed() < FOLLOW_POLL / 10, "{line:?} waited {:?}", written.elapsed());
        }
        // Without ticks the poll still finds what is appended.
        drop(appended);
        log.write(&entries("three\n")).unwrap();
        assert_eq!(rx.recv().await.unwrap(), "three\n");
    }

    /// The last lines of a large log are found by reading backwards: the answer comes in
    /// one chunk however large the log.
    #[tokio::test]
    async fn a_tail_reads_from_the_end() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RotatingLog::open(dir.path(), 8 << 20, 2).unwrap();
        let line = encode(at(1), Stream::Stdout, format!("{}\n", "y".repeat(200)).as_bytes());
        for _ in 0..40_000 {
            log.write(&line).unwrap();
        }
        log.write(&encode(at(2), Stream::Stdout, b"the last\n")).unwrap();
        let mut files = Files::open(dir.path()).await;
        let len = files.len();
        assert!(len > 8 << 20);
        let options = LogOptions { tail: Some(1), ..LogOptions::default() };
        let (start, end) = region(&mut files, len, &options).await.unwrap();
        assert_eq!(end - start, encode(at(2), Stream::Stdout, b"the last\n").len() as u64);
        assert_eq!(read_all(stream(dir.path(), options, quiet()).await.unwrap()).await, "the last\n");
    }

    /// A reader that takes nothing holds at most [`QUEUED`] chunks however large the log.
    #[tokio::test]
    async fn an_unread_stream_holds_a_bounded_queue() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RotatingLog::open(dir.path(), 64 << 20, 1).unwrap();
        let line = encode(at(1), Stream::Stdout, format!("{}\n", "z".repeat(1000)).as_bytes());
        for _ in 0..10_000 {
            log.write(&line).unwrap();
        }
        let mut rx = stream(dir.path(), LogOptions::default(), quiet()).await.unwrap();
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let mut queued = 0;
        while let Ok(chunk) = rx.try_recv() {
            queued += chunk.len();
        }
        assert!(queued <= QUEUED * CHUNK, "{queued} bytes queued for a reader that took nothing");
        assert!(queued > 0);
    }
}
