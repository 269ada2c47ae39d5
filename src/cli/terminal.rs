//! The terminal the CLI prints to: its width (`COLUMNS` when exported, else the size the
//! terminal reports, none for a pipe or file), cutting text to a width, and escaping the
//! control characters that would drive it (`escape_controls`).

use std::io::IsTerminal as _;

/// The width to fit output to: `$COLUMNS` when it is exported as a positive number (an
/// explicit request, honoured even for a pipe), else the width of the terminal on
/// stdout, else `None` (a pipe or a file: print everything).
pub fn width() -> Option<usize> {
    if let Some(columns) = crate::host::env::var("COLUMNS").and_then(|c| c.trim().parse::<usize>().ok()) {
        if columns > 0 {
            return Some(columns);
        }
    }
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        return None;
    }
    rustix::termios::tcgetwinsize(&stdout).ok().map(|size| usize::from(size.ws_col)).filter(|w| *w > 0)
}

/// The number of characters in `text` (what a terminal shows for the text hive prints).
pub fn text_width(text: &str) -> usize {
    text.chars().count()
}

/// `text` cut to at most `width` characters, ending in `…` when something was cut.
pub fn ellipsize(text: &str, width: usize) -> String {
    if text_width(text) <= width {
        return text.to_string();
    }
    if width == 0 {
        return String::new();
    }
    let mut out: String = text.chars().take(width - 1).collect();
    out.push('…');
    out
}

/// `text` with every control character a terminal would act on made visible, so text
/// an object's writer chose (an agent token's Approval summary, an Event message) cannot
/// set the window title, recolour, move the cursor or hide lines on the operator's
/// terminal. kubectl's `printers.EscapeTerminal` writes ESC as `^[` and CR as `\r`; it
/// leaves BEL and the C1 controls (U+0080–U+009F, U+009B being a one-character CSI) raw,
/// so hive also writes every other C0 control, DEL and C1 control as `\xNN` / `\u{NN}`.
/// A line feed and a tab are kept: callers whose layout cannot hold them (a table cell)
/// flatten them first. Text without a control character is borrowed, not copied.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    let needs = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(needs) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !needs(c) => out.push(c),
            '\u{1b}' => out.push_str("^["),
            '\r' => out.push_str("\\r"),
            c if u32::from(c) < 0x80 => out.push_str(&format!("\\x{:02x}", u32::from(c))),
            c => out.push_str(&format!("\\u{{{:x}}}", u32::from(c))),
        }
    }
    std::borrow::Cow::Owned(out)
}

/// Writes one line to stderr (a message, a warning, an error), its control characters
/// escaped as `output::print` escapes them.
pub fn eprint_line(text: &str) {
    eprintln!("{}", escape_controls(text));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_controls_makes_every_terminal_control_visible() {
        assert!(matches!(escape_controls("plain ünïcode\tand\nlines"), std::borrow::Cow::Borrowed(_)));
        assert_eq!(escape_controls("\u{1b}]0;pwned\u{7}\u{1b}[31m"), "^[]0;pwned\\x07^[[31m");
        assert_eq!(escape_controls("a\rb\u{0}c\u{7f}d\u{9b}2Je\u{85}"), "a\\rb\\x00c\\x7fd\\u{9b}2Je\\u{85}");
    }

    #[test]
    fn ellipsize_cuts_only_what_does_not_fit() {
        assert_eq!(ellipsize("hello", 5), "hello");
        assert_eq!(ellipsize("hello world", 5), "hell…");
        assert_eq!(ellipsize("héllo wörld", 6), "héllo…");
        assert_eq!(ellipsize("abc", 1), "…");
        assert_eq!(ellipsize("abc", 0), "");
    }
}
