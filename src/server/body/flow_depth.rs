//! How deeply a YAML body may nest flow collections (`[…]`, `{…}`), checked before the YAML
//! parser reads it. libyaml's scanner looks at every open flow level for every token, so a
//! body of nothing but nested flow mappings (`{a: {a: {a: …`) costs time quadratic in its
//! length — 100,000 levels took over a minute — and the deserializer's own limit of 128
//! levels only applies once the parser has read the whole document.
//!
//! The check is one linear pass. It cannot know how libyaml will tokenize every byte (a
//! quote after a word may open a quoted scalar or belong to a plain one that continues; a
//! block scalar may end at any line), so it follows every way the body could be read at
//! once, each with the flow depths it may be at (a small automaton over sets of depths).
//! The way libyaml reads the body is among them, so no body that libyaml would nest past
//! [`MAX_FLOW_DEPTH`] gets through; a body is refused only when some way of reading it
//! goes past that, which takes more than a hundred unclosed `[` or `{` in its text.

/// The deepest flow nesting a YAML body may have: the deserializer's own limit.
pub const MAX_FLOW_DEPTH: usize = 128;

/// The flow depths a way of reading the body may be at: bit `d` for depth `d`
/// (0..=127 in `low`, 128 in `top`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Debug)]
struct Depths {
    low: u128,
    top: bool,
}

impl Depths {
    const ZERO: Depths = Depths { low: 1, top: false };

    fn is_empty(self) -> bool {
        self.low == 0 && !self.top
    }

    fn or(self, other: Depths) -> Depths {
        Depths { low: self.low | other.low, top: self.top || other.top }
    }

    /// One level deeper; `None` when one of them would pass [`MAX_FLOW_DEPTH`].
    fn deeper(self) -> Option<Depths> {
        if self.top {
            return None;
        }
        Some(Depths { low: self.low << 1, top: self.low >> 127 == 1 })
    }

    /// One level shallower (a close at depth 0 stays at 0: libyaml ignores it).
    fn shallower(self) -> Depths {
        Depths { low: (self.low >> 1) | (self.low & 1) | (u128::from(self.top) << 127), top: false }
    }

    /// Only depth 0: block context.
    fn block(self) -> Depths {
        Depths { low: self.low & 1, top: false }
    }

    /// Every depth but 0: flow context.
    fn flow(self) -> Depths {
        Depths { low: self.low & !1, top: self.top }
    }
}

/// Where a way of reading the body is.
#[derive(Clone, Copy)]
enum At {
    /// Where a token starts (after an indicator, a quoted scalar, a comment; or blanks
    /// after those).
    Token,
    /// Blanks after a plain scalar, which may go on after them.
    Gap,
    /// In a plain scalar, an anchor, an alias or a tag.
    Plain,
    /// Just after a `:` in a plain scalar: followed by a blank, it ends the scalar.
    Colon,
    /// Just after a `!` where a token starts.
    Tag,
    /// In a verbatim tag `!<…>`, where brackets are part of it.
    Verbatim,
    /// In a single-quoted scalar.
    Single,
    /// In a double-quoted scalar.
    Double,
    /// After a `\` in a double-quoted scalar.
    Escape,
    /// In a comment.
    Comment,
    /// In a block scalar (`|`, `>`), only in block context.
    Block,
}

const PLACES: [At; 11] = [
    At::Token,
    At::Gap,
    At::Plain,
    At::Colon,
    At::Tag,
    At::Verbatim,
    At::Single,
    At::Double,
    At::Escape,
    At::Comment,
    At::Block,
];

fn is_blank(byte: u8) -> bool {
    matches!(byte, b' ' | b'\t' | b'\n' | b'\r')
}

/// Whether `byte` means nothing to YAML's tokens: after one such byte, another changes no
/// way of reading the body (each is then in a scalar, a comment or a tag).
fn is_plain_text(byte: u8) -> bool {
    !matches!(
        byte,
        b' ' | b'\t'
            | b'\r'
            | b'\n'
            | b','
            | b'#'
            | b'['
            | b']'
            | b'{'
            | b'}'
            | b'\''
            | b'"'
            | b'|'
            | b'>'
            | b'<'
            | b'!'
            | b'-'
            | b'?'
            | b':'
            | b'\\'
    )
}

/// The ways of reading the body so far: for each place, the depths it may be at (`live`
/// has a bit for each place that has any).
struct Ways {
    at: [Depths; PLACES.len()],
    live: u16,
}

impl Ways {
    fn new() -> Ways {
        Ways { at: [Depths::default(); PLACES.len()], live: 0 }
    }

    fn add(&mut self, at: At, depths: Depths) {
        if depths.is_empty() {
            return;
        }
        let slot = &mut self.at[at as usize];
        *slot = slot.or(depths);
        self.live |= 1 << at as u16;
    }

    /// `byte` read where a token starts, at `depths`.
    fn token(&mut self, depths: Depths, byte: u8) -> Option<()> {
        match byte {
            b',' => self.add(At::Token, depths),
            _ if is_blank(byte) => self.add(At::Token, depths),
            b'#' => self.add(At::Comment, depths),
            b'[' | b'{' => self.add(At::Token, depths.deeper()?),
            b']' | b'}' => self.add(At::Token, depths.shallower()),
            b'\'' => self.add(At::Single, depths),
            b'"' => self.add(At::Double, depths),
            // Only in block context; in flow context libyaml stops there.
            b'|' | b'>' => self.add(At::Block, depths.block()),
            b'!' => self.add(At::Tag, depths),
            // An indicator, or the start of a plain scalar (`-1`, `:x`).
            b'-' | b'?' | b':' => {
                self.add(At::Token, depths);
                self.add(At::Plain, depths);
            }
            _ => self.add(At::Plain, depths),
        }
        Some(())
    }

    /// `byte` read in a plain scalar, at `depths`.
    fn plain(&mut self, depths: Depths, byte: u8) -> Option<()> {
        match byte {
            _ if is_blank(byte) => self.add(At::Gap, depths),
            b':' => self.add(At::Colon, depths),
            // In flow context these end the scalar and are tokens; in block context they
            // are part of it.
            b'[' | b'{' | b']' | b'}' | b',' => {
                self.add(At::Plain, depths.block());
                let flow = depths.flow();
                if !flow.is_empty() {
                    self.token(flow, byte)?;
                }
            }
            _ => self.add(At::Plain, depths),
        }
        Some(())
    }

    /// Reads one byte in every way at once into `next` (emptied first); `None` when one
    /// goes too deep.
    fn step(&self, byte: u8, next: &mut Ways) -> Option<()> {
        next.clear();
        let mut live = self.live;
        while live != 0 {
            let at = PLACES[live.trailing_zeros() as usize];
            live &= live - 1;
            let depths = self.at[at as usize];
            match at {
                At::Token => next.token(depths, byte)?,
                At::Gap => match byte {
                    _ if is_blank(byte) => next.add(At::Gap, depths),
                    b'#' => next.add(At::Comment, depths),
                    _ => {
                        // Either a new token starts, or the plain scalar goes on (in flow
                        // context a flow indicator ends it).
                        next.token(depths, byte)?;
                        let goes_on = match byte {
                            b'[' | b'{' | b']' | b'}' | b',' => depths.block(),
                            _ => depths,
                        };
                        next.plain(goes_on, byte)?;
                    }
                },
                At::Plain => next.plain(depths, byte)?,
                // `: ` ends the scalar (a key's); `a:b` is one scalar.
                At::Colon if is_blank(byte) => next.add(At::Token, depths),
                At::Colon => next.plain(depths, byte)?,
                At::Tag if byte == b'<' => next.add(At::Verbatim, depths),
                At::Tag => next.plain(depths, byte)?,
                At::Verbatim if byte == b'>' => next.add(At::Plain, depths),
                At::Verbatim => next.add(At::Verbatim, depths),
                // A quote ends the scalar; two in a row are one quote in it, which the next
                // byte, read where a token starts, opens again.
                At::Single if byte == b'\'' => next.add(At::Token, depths),
                At::Single => next.add(At::Single, depths),
                At::Double if byte == b'\\' => next.add(At::Escape, depths),
                At::Double if byte == b'"' => next.add(At::Token, depths),
                At::Double => next.add(At::Double, depths),
                At::Escape => next.add(At::Double, depths),
                At::Comment if matches!(byte, b'\n' | b'\r') => next.add(At::Token, depths),
                At::Comment => next.add(At::Comment, depths),
                // A block scalar ends at a line less indented than its content: at any
                // line, as far as this pass knows.
                At::Block if matches!(byte, b'\n' | b'\r') => {
                    next.add(At::Block, depths);
                    next.add(At::Token, depths);
                }
                At::Block => next.add(At::Block, depths),
            }
        }
        Some(())
    }

    fn clear(&mut self) {
        let mut live = self.live;
        while live != 0 {
            self.at[live.trailing_zeros() as usize] = Depths::default();
            live &= live - 1;
        }
        self.live = 0;
    }
}

/// Checks that `text` nests flow collections at most [`MAX_FLOW_DEPTH`] deep, however
/// libyaml reads it; `Err` holds the line (from 1) where it may go deeper.
pub fn check(text: &str) -> Result<(), usize> {
    let (mut ways, mut next) = (Ways::new(), Ways::new());
    ways.add(At::Token, Depths::ZERO);
    let mut line: usize = 1;
    let mut after_text = false;
    for &byte in text.as_bytes() {
        let text = is_plain_text(byte);
        if !(text && after_text) {
            ways.step(byte, &mut next).ok_or(line)?;
            std::mem::swap(&mut ways, &mut next);
        }
        after_text = text;
        if byte == b'\n' {
            line += 1;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nested(depth: usize, open: &str, inner: &str, close: &str) -> String {
        format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
    }

    #[test]
    fn bodies_within_the_bound_pass_and_deeper_ones_are_refused_naming_the_line() {
        let fine = [
            "a: 1\nb: [x, y, {c: d}]\n",
            "command: [sh, -c, 'echo [ and { inside a quote']\n",
            "text: it's [not] a {flow} collection [at all\nmore: \"[[[[\\\"[[[\"\n",
            "script: |\n  if [ -f x ]; then echo {; fi\n  [[[[[[[[\nnext: [a]\n",
            "# a comment [[[[[[[[[[[[[[[[\nkey: value # another {{{{{{{{{{{{{\n",
            "tag: !<tag:x,2000:[[[[[[> value\n",
        ];
        for text in fine {
            assert_eq!(check(text), Ok(()), "{text}");
        }
        assert_eq!(check(&nested(MAX_FLOW_DEPTH, "[", "1", "]")), Ok(()));
        assert_eq!(check(&nested(MAX_FLOW_DEPTH, "{a: ", "1", "}")), Ok(()));
        // 10,000 lines each closing what it opens.
        assert_eq!(check(&"deps: [a, {b: [c]}]\n".repeat(10_000)), Ok(()));
        assert_eq!(check(&format!("x: [{}]\n", "'[', ".repeat(1000))), Ok(()), "brackets in quotes");

        let deep = [
            nested(MAX_FLOW_DEPTH + 1, "[", "1", "]"),
            nested(100_000, "{\"a\":", "1", "}"),
            format!("a: b\nc: {}", nested(200, "{a: ", "1", "}")),
            // A quote that a naive scan would take as opening a quoted scalar, hiding
            // what follows: libyaml reads it inside the plain scalar.
            format!("a: text\n  'x\nb: {}\n", nested(200, "{a: ", "1", "}")),
            // A block scalar's end is found by indentation.
            format!("a: |\n  '\nb: {}\n", nested(200, "[", "1", "]")),
        ];
        for text in &deep {
            assert!(check(text).is_err(), "{:.60}", text);
        }
        assert_eq!(check(&format!("a: 1\nb: 2\nc: {}", nested(200, "[", "", "]"))), Err(3));
    }
}
