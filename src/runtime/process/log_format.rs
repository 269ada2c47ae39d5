//! The agent log's line format and how a reader selects from it. Each line the agent
//! prints is stored as the kubelet stores a container's (the CRI log format), stamped by
//! the supervisor as it reads the pipe:
//!
//! ```text
//! 2026-12-01T17:00:00.123456789Z stdout F hello
//! 2026-12-01T17:00:00.123460000Z stderr P a line the pipe delivered in two pieces, whose
//! 2026-12-01T17:00:00.123470000Z stderr F  rest followed
//! ```
//!
//! `F` ends a line, `P` is a piece of one that continues in the next entry. A third
//! stream, `run`, marks where a run of the agent (a start or a restart) begins, so the
//! previous run's lines can be told from the current one's. Readers never see the
//! prefixes unless they ask for timestamps, and never see `run` entries: the default
//! output is the agent's own text, as it was before lines carried their time. A line
//! without the prefix (written before this format) is read as stdout with no time.

use chrono::{DateTime, SecondsFormat, Utc};

use crate::runtime::LogOptions;

/// Where an entry came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    /// The agent's standard output.
    Stdout,
    /// The agent's standard error.
    Stderr,
    /// The supervisor: a new run of the agent begins here.
    Run,
}

impl Stream {
    fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Run => "run",
        }
    }

    fn parse(name: &[u8]) -> Option<Stream> {
        match name {
            b"stdout" => Some(Stream::Stdout),
            b"stderr" => Some(Stream::Stderr),
            b"run" => Some(Stream::Run),
            _ => None,
        }
    }
}

/// An entry's time as it is written: RFC 3339 in UTC with nanoseconds.
pub fn timestamp(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Nanos, true)
}

/// The entries for `chunk`, read from `stream` at `at`: one `F` entry per complete line
/// and a `P` entry for a trailing piece without its newline, so output that never ends
/// its line (a prompt, a progress bar) is still stored as it arrives.
pub fn encode(at: DateTime<Utc>, stream: Stream, chunk: &[u8]) -> Vec<u8> {
    let stamp = timestamp(at);
    let mut out = Vec::with_capacity(chunk.len() + 40);
    for piece in chunk.split_inclusive(|b| *b == b'\n') {
        let (text, tag) = match piece.strip_suffix(b"\n") {
            Some(line) => (line, "F"),
            None => (piece, "P"),
        };
        out.extend_from_slice(stamp.as_bytes());
        out.push(b' ');
        out.extend_from_slice(stream.name().as_bytes());
        out.push(b' ');
        out.extend_from_slice(tag.as_bytes());
        out.push(b' ');
        out.extend_from_slice(text);
        out.push(b'\n');
    }
    out
}

/// One stored entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry<'a> {
    /// When the supervisor read it; `None` for a line in the older, unprefixed format.
    pub at: Option<DateTime<Utc>>,
    /// Where it came from.
    pub stream: Stream,
    /// A piece of a line that continues in the next entry.
    pub partial: bool,
    /// The text, without the newline.
    pub text: &'a [u8],
}

/// Reads one stored line (without its newline).
pub fn parse(line: &[u8]) -> Entry<'_> {
    let plain = Entry { at: None, stream: Stream::Stdout, partial: false, text: line };
    let mut fields = line.splitn(4, |b| *b == b' ');
    let (Some(time), Some(stream), Some(tag)) = (fields.next(), fields.next(), fields.next()) else {
        return plain;
    };
    let text = fields.next().unwrap_or(b"");
    let at = std::str::from_utf8(time).ok().and_then(|t| DateTime::parse_from_rfc3339(t).ok());
    let partial = match tag {
        b"F" => false,
        b"P" => true,
        _ => return plain,
    };
    match (at, Stream::parse(stream)) {
        (Some(at), Some(stream)) => Entry { at: Some(at.with_timezone(&Utc)), stream, partial, text },
        _ => plain,
    }
}

/// There is no run before the current one in the retained log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoPreviousRun;

/// Renders entries as the reader asked: the agent's text only, or each line prefixed
/// with its time. It holds what spans two calls — an entry cut at the end of what was
/// read so far, and whether the output stands at the start of a line — so the same
/// renderer serves what was stored and then, when following, what is appended.
#[derive(Debug)]
pub struct Renderer {
    since: Option<DateTime<Utc>>,
    timestamps: bool,
    at_line_start: bool,
    carry: Vec<u8>,
}

impl Renderer {
    /// A renderer for `options` (its `since` and `timestamps`).
    pub fn new(options: &LogOptions) -> Renderer {
        Renderer {
            since: options.since,
            timestamps: options.timestamps,
            at_line_start: true,
            carry: Vec::new(),
        }
    }

    /// What the stored `bytes` show under `options`: the previous run only when asked,
    /// lines at or after `since`, the last `tail` lines. An entry cut off at the end
    /// is kept for [`Renderer::follow`].
    pub fn select(&mut self, bytes: &[u8], options: &LogOptions) -> Result<Vec<u8>, NoPreviousRun> {
        let complete = self.take_complete(bytes);
        let lines: Vec<&[u8]> = complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()).collect();
        let entries: Vec<Entry<'_>> = lines.iter().map(|l| parse(l)).collect();
        let chosen = if options.previous { previous_run(&entries)? } else { &entries[..] };
        let mut out = Vec::new();
        for entry in chosen {
            self.push(entry, &mut out);
        }
        if let Some(n) = options.tail {
            let lines: Vec<&[u8]> = out.split_inclusive(|b| *b == b'\n').collect();
            out = lines[lines.len().saturating_sub(n)..].concat();
        }
        Ok(out)
    }

    /// What newly appended `bytes` show (no selection of runs: the follower is in the
    /// current one).
    pub fn follow(&mut self, bytes: &[u8]) -> Vec<u8> {
        let complete = self.take_complete(bytes);
        let mut out = Vec::new();
        for line in complete.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            self.push(&parse(line), &mut out);
        }
        out
    }

    /// The carried bytes and `bytes` up to their last newline; the rest is carried on.
    fn take_complete(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.carry.extend_from_slice(bytes);
        match self.carry.iter().rposition(|b| *b == b'\n') {
            Some(end) => {
                let rest = self.carry.split_off(end + 1);
                std::mem::replace(&mut self.carry, rest)
            }
            None => Vec::new(),
        }
    }

    fn push(&mut self, entry: &Entry<'_>, out: &mut Vec<u8>) {
        if entry.stream == Stream::Run {
            return;
        }
        if let Some(since) = self.since {
            if entry.at.is_none_or(|at| at < since) {
                return;
            }
        }
        if self.at_line_start && self.timestamps {
            if let Some(at) = entry.at {
                out.extend_from_slice(timestamp(at).as_bytes());
                out.push(b' ');
            }
        }
        out.extend_from_slice(entry.text);
        if entry.partial {
            self.at_line_start = false;
        } else {
            out.push(b'\n');
            self.at_line_start = true;
        }
    }
}

/// The entries of the run before the last one: between the last two `run` marks, or,
/// when the retained log holds one mark, what comes before it (its run's start was
/// rotated away).
fn previous_run<'e, 'a>(entries: &'e [Entry<'a>]) -> Result<&'e [Entry<'a>], NoPreviousRun> {
    let marks: Vec<usize> =
        entries.iter().enumerate().filter(|(_, e)| e.stream == Stream::Run).map(|(i, _)| i).collect();
    let Some(&last) = marks.last() else { return Err(NoPreviousRun) };
    let start = marks.len().checked_sub(2).map_or(0, |i| marks[i] + 1);
    if start == last && marks.len() < 2 {
        return Err(NoPreviousRun);
    }
    Ok(&entries[start..last])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(second: u32) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(&format!("2026-12-01T17:00:{second:02}.000000001Z")).unwrap().to_utc()
    }

    fn log(parts: &[(u32, Stream, &str)]) -> Vec<u8> {
        parts.iter().flat_map(|(s, stream, text)| encode(at(*s), *stream, text.as_bytes())).collect()
    }

    fn show(bytes: &[u8], options: LogOptions) -> String {
        String::from_utf8(Renderer::new(&options).select(bytes, &options).unwrap()).unwrap()
    }

    #[test]
    fn entries_are_cri_lines_and_pieces_join_again() {
        let bytes = encode(at(1), Stream::Stderr, b"one\ntw");
        assert_eq!(
            String::from_utf8(bytes.clone()).unwrap(),
            "2026-12-01T17:00:01.000000001Z stderr F one\n2026-12-01T17:00:01.000000001Z stderr P tw\n"
        );
        let mut all = bytes;
        all.extend(encode(at(2), Stream::Stdout, b"o\n"));
        assert_eq!(show(&all, LogOptions::default()), "one\ntwo\n");
        let stamped = show(&all, LogOptions { timestamps: true, ..LogOptions::default() });
        assert_eq!(stamped, "2026-12-01T17:00:01.000000001Z one\n2026-12-01T17:00:01.000000001Z two\n");
    }

    #[test]
    fn selection_by_run_time_and_tail() {
        let bytes = log(&[
            (1, Stream::Run, "pid 10"),
            (2, Stream::Stdout, "first run\n"),
            (3, Stream::Run, "pid 11"),
            (4, Stream::Stdout, "second run\n"),
            (5, Stream::Run, "pid 12"),
            (6, Stream::Stderr, "third run\nstill third\n"),
        ]);
        let default = LogOptions::default();
        let cases: [(&str, LogOptions, &str); 5] = [
            ("everything, marks hidden", default, "first run\nsecond run\nthird run\nstill third\n"),
            ("previous", LogOptions { previous: true, ..default }, "second run\n"),
            ("since", LogOptions { since: Some(at(4)), ..default }, "second run\nthird run\nstill third\n"),
            ("tail", LogOptions { tail: Some(1), ..default }, "still third\n"),
            (
                "since and tail",
                LogOptions { since: Some(at(6)), tail: Some(5), ..default },
                "third run\nstill third\n",
            ),
        ];
        for (name, options, want) in cases {
            assert_eq!(show(&bytes, options), want, "{name}");
        }
    }

    #[test]
    fn previous_needs_a_run_before_the_current_one() {
        let options = LogOptions { previous: true, ..LogOptions::default() };
        let one_run = log(&[(1, Stream::Run, "pid 10"), (2, Stream::Stdout, "only\n")]);
        assert_eq!(Renderer::new(&options).select(&one_run, &options), Err(NoPreviousRun));
        assert_eq!(Renderer::new(&options).select(b"", &options), Err(NoPreviousRun));
        // Its mark rotated away: what precedes the one retained mark is the previous run.
        let rotated = log(&[(2, Stream::Stdout, "tail of run one\n"), (3, Stream::Run, "pid 11")]);
        assert_eq!(show(&rotated, options), "tail of run one\n");
    }

    #[test]
    fn unprefixed_lines_read_as_they_are_and_have_no_time() {
        let mut bytes = b"from an older daemon\n".to_vec();
        bytes.extend(log(&[(2, Stream::Stdout, "new\n")]));
        assert_eq!(show(&bytes, LogOptions::default()), "from an older daemon\nnew\n");
        assert_eq!(show(&bytes, LogOptions { since: Some(at(1)), ..LogOptions::default() }), "new\n");
    }

    #[test]
    fn a_follower_joins_entries_cut_between_reads() {
        let options = LogOptions { timestamps: true, ..LogOptions::default() };
        let bytes = log(&[(1, Stream::Stdout, "a\n"), (2, Stream::Stdout, "b\n")]);
        let (first, rest) = bytes.split_at(45);
        let mut renderer = Renderer::new(&options);
        assert_eq!(renderer.select(first, &options).unwrap(), b"2026-12-01T17:00:01.000000001Z a\n");
        assert_eq!(renderer.follow(&rest[..3]), b"");
        assert_eq!(renderer.follow(&rest[3..]), b"2026-12-01T17:00:02.000000001Z b\n");
    }
}
