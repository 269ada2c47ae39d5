//! A small HTML builder that always escapes: tag and attribute names are `&'static str`
//! chosen by our code, and every attribute value and every text node is escaped on the
//! way in, so data can never become markup.

use std::fmt::Write as _;

/// Escapes `&`, `<`, `>`, `"` and `'` so `text` is safe both as a text node and inside a
/// quoted attribute value.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Markup under construction.
#[derive(Default)]
pub struct Markup {
    buf: String,
}

impl Markup {
    /// An empty document fragment.
    pub fn new() -> Markup {
        Markup::default()
    }

    /// Opens `<tag a="v" …>`; attributes with an empty name are skipped, so optional
    /// attributes can be written inline as `("", "")`.
    pub fn open(&mut self, tag: &'static str, attrs: &[(&'static str, &str)]) -> &mut Markup {
        self.buf.push('<');
        self.buf.push_str(tag);
        for (name, value) in attrs {
            if name.is_empty() {
                continue;
            }
            let _ = write!(self.buf, " {name}=\"{}\"", escape(value));
        }
        self.buf.push('>');
        self
    }

    /// Closes `</tag>`.
    pub fn close(&mut self, tag: &'static str) -> &mut Markup {
        let _ = write!(self.buf, "</{tag}>");
        self
    }

    /// An escaped text node.
    pub fn text(&mut self, text: &str) -> &mut Markup {
        self.buf.push_str(&escape(text));
        self
    }

    /// `<tag …>text</tag>`.
    pub fn elem(&mut self, tag: &'static str, attrs: &[(&'static str, &str)], text: &str) -> &mut Markup {
        self.open(tag, attrs).text(text).close(tag)
    }

    /// A void element such as `<input …>` or `<meta …>`.
    pub fn void(&mut self, tag: &'static str, attrs: &[(&'static str, &str)]) -> &mut Markup {
        self.open(tag, attrs)
    }

    /// The HTML5 doctype.
    pub fn buf_doctype(&mut self) -> &mut Markup {
        self.buf.push_str("<!doctype html>");
        self
    }

    /// The finished markup.
    pub fn finish(self) -> String {
        self.buf
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_and_attributes_are_escaped() {
        let mut m = Markup::new();
        m.open("a", &[("href", "/agents/\"x\"><script>"), ("", "skipped")]).text("<b>&'").close("a");
        assert_eq!(m.finish(), "<a href=\"/agents/&quot;x&quot;&gt;&lt;script&gt;\">&lt;b&gt;&amp;&#39;</a>");
    }
}
