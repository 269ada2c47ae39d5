//! The terminal the CLI prints to: its width (`COLUMNS` when exported, else the size the
//! terminal reports, none for a pipe or file), and cutting text to a width.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ellipsize_cuts_only_what_does_not_fit() {
        assert_eq!(ellipsize("hello", 5), "hello");
        assert_eq!(ellipsize("hello world", 5), "hell…");
        assert_eq!(ellipsize("héllo wörld", 6), "héllo…");
        assert_eq!(ellipsize("abc", 1), "…");
        assert_eq!(ellipsize("abc", 0), "");
    }
}
