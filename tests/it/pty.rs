//! A terminal for tests: runs a command with its stdout on a pseudo-terminal of a set
//! size (rustix's `openpt` … `ptsname`, `tcsetwinsize`), and a small screen model that
//! plays the captured bytes as a terminal would — `\r`, `\n`, printable text,
//! `ESC[nA` (cursor up), `ESC[K` / `ESC[2K` (erase in line), `ESC[J` (erase below) —
//! so a test asserts on what a user ends up seeing. Anything else the program sends is
//! refused, and so is a character past the last column (a real terminal would wrap it
//! onto the next row, which breaks redrawing in place).

use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::process::{Command, ExitStatus, Stdio};

use rustix::pty::{grantpt, openpt, ptsname, unlockpt, OpenptFlags};
use rustix::termios::{tcsetwinsize, Winsize};

/// What a command printed on the terminal, and how it ended.
pub struct Captured {
    /// Its exit status.
    pub status: ExitStatus,
    /// Every byte written to the terminal (after the line discipline: `\n` arrives as
    /// `\r\n`).
    pub bytes: Vec<u8>,
    /// What it wrote to stderr (a pipe).
    pub stderr: String,
}

/// Runs `command` with stdout on a fresh pseudo-terminal of `cols` × `rows` (stdin
/// from /dev/null, stderr to a pipe), and returns what it printed there.
pub fn run(command: &mut Command, cols: u16, rows: u16) -> Captured {
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY).expect("openpt");
    grantpt(&master).expect("grantpt");
    unlockpt(&master).expect("unlockpt");
    let name = ptsname(&master, Vec::new()).expect("ptsname");
    let name = name.to_str().expect("a pty's name is text").to_string();
    let terminal: OwnedFd = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&name)
        .unwrap_or_else(|e| panic!("opening {name}: {e}"))
        .into();
    tcsetwinsize(&terminal, Winsize { ws_row: rows, ws_col: cols, ws_xpixel: 0, ws_ypixel: 0 })
        .expect("setting the terminal's size");
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::from(terminal))
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    // Drops the command's copy of the terminal: the child then holds the only one, so
    // reading ends when it exits (the master reads EIO).
    command.stdout(Stdio::null());
    let mut stderr = child.stderr.take().expect("piped stderr");
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let mut master = std::fs::File::from(master);
    let mut bytes = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        match master.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => bytes.extend_from_slice(&chunk[..n]),
            // Linux: every slave descriptor is closed.
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::IO.raw_os_error()) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => panic!("reading the terminal: {e}"),
        }
    }
    let status = child.wait().expect("the command ends");
    Captured { status, bytes, stderr: errors.join().unwrap_or_default() }
}

/// The screen a terminal `cols` wide shows after `bytes` (as many rows as were
/// written; the top row is the first one printed). Panics on a control sequence the
/// model does not know and on a character that would land past the last column.
pub fn screen(bytes: &[u8], cols: usize) -> Vec<String> {
    let text = String::from_utf8_lossy(bytes);
    let mut rows: Vec<Vec<char>> = vec![Vec::new()];
    let (mut row, mut col) = (0usize, 0usize);
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\r' => col = 0,
            '\n' => {
                row += 1;
                if rows.len() <= row {
                    rows.push(Vec::new());
                }
            }
            '\x1b' => {
                assert_eq!(chars.next(), Some('['), "only CSI sequences are expected: {text:?}");
                let mut param = String::new();
                let command = loop {
                    match chars.next() {
                        Some(d) if d.is_ascii_digit() || d == ';' => param.push(d),
                        Some(command) => break command,
                        None => panic!("an unfinished escape sequence at the end: {text:?}"),
                    }
                };
                let n: usize = param.parse().unwrap_or(0);
                let line = &mut rows[row];
                match (command, n) {
                    ('A', n) => row = row.saturating_sub(n.max(1)),
                    ('K', 0) => line.truncate(col),
                    ('K', 2) => line.clear(),
                    ('J', 0) => {
                        line.truncate(col);
                        rows.truncate(row + 1);
                    }
                    // Colours and other attributes change no text.
                    ('m', _) => {}
                    (other, n) => panic!("an unexpected control sequence ESC[{n}{other}: {text:?}"),
                }
            }
            c if c.is_control() => panic!("an unexpected control character {c:?}: {text:?}"),
            c => {
                assert!(
                    col < cols,
                    "a character past column {cols} (the terminal would wrap it): {c:?} on row {row}: {:?}",
                    rows[row].iter().collect::<String>()
                );
                let line = &mut rows[row];
                if line.len() <= col {
                    line.resize(col + 1, ' ');
                }
                line[col] = c;
                col += 1;
            }
        }
    }
    let mut out: Vec<String> = rows.into_iter().map(|r| r.into_iter().collect::<String>()).collect();
    while out.last().is_some_and(|l| l.trim().is_empty()) {
        out.pop();
    }
    out
}

#[test]
fn the_screen_model_redraws_in_place_as_a_terminal_does() {
    let bytes = b"job submitted\r\n\r\x1b[2Kone \xc2\xb7\r\n\r\x1b[2Ktwo \xc2\xb7\r\n\x1b[2A\r\x1b[2Kone \xe2\x9c\x93\r\n\r\x1b[2Ktwo \xe2\x9c\x93\r\nsummary\r\n";
    assert_eq!(screen(bytes, 20), ["job submitted", "one ✓", "two ✓", "summary"]);
    assert_eq!(screen(b"abcdef\rxy\x1b[K\r\n", 10), ["xy"]);
}

#[test]
#[should_panic(expected = "past column 4")]
fn the_screen_model_refuses_a_line_that_would_wrap() {
    screen(b"abcde", 4);
}
