//! Text for a terminal: what a model or a client chose (a reply, a session
//! name, an error it sent) is shown, never obeyed. Every control character
//! (ESC, NUL, CR, BEL, the C1 controls) is written as its escape, `\u{1b}`,
//! `\0`, `\r`, so that no control sequence reaches the terminal, and a name
//! cannot forge a line of its own. JSON outputs keep the data exact: serde
//! escapes the C0 controls, and [`json`] the others (DEL and the C1
//! controls, which JSON allows raw) as `\u00XX`.

use std::borrow::Cow;
use std::io;

use serde::Serialize;
use serde_json::ser::{CompactFormatter, Formatter, PrettyFormatter};

/// `text` for one line: every control character escaped, newlines too.
pub fn one_line(text: &str) -> Cow<'_, str> {
    escape(text, |_| true)
}

/// `text` that may run over several lines: every control character escaped
/// but the newline and the tab.
pub fn lines(text: &str) -> Cow<'_, str> {
    escape(text, |c| c != '\n' && c != '\t')
}

/// Whether `c` would change how a terminal shows the text around it
/// without being seen itself (the stream crate's, which quotes a model
/// server's words the same way).
pub use settle_stream::hides;

fn escape(text: &str, escaped: impl Fn(char) -> bool) -> Cow<'_, str> {
    let is_escaped = |c: char| hides(c) && escaped(c);
    if !text.chars().any(is_escaped) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_escaped(c) {
            out.extend(c.escape_debug());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `value` as JSON (indented when `pretty`) in which no control character
/// is written raw.
pub fn json<T: Serialize + ?Sized>(value: &T, pretty: bool) -> serde_json::Result<String> {
    let mut out = Vec::new();
    if pretty {
        let mut ser =
            serde_json::Serializer::with_formatter(&mut out, NoRawControls(PrettyFormatter::new()));
        value.serialize(&mut ser)?;
    } else {
        let mut ser =
            serde_json::Serializer::with_formatter(&mut out, NoRawControls(CompactFormatter));
        value.serialize(&mut ser)?;
    }
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// A JSON formatter that escapes DEL and the C1 controls too.
struct NoRawControls<F>(F);

impl<F: Formatter> Formatter for NoRawControls<F> {
    fn write_string_fragment<W: ?Sized + io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> io::Result<()> {
        let mut rest = fragment;
        while let Some(at) = rest.find(|c: char| c.is_control()) {
            writer.write_all(&rest.as_bytes()[..at])?;
            let c = rest[at..].chars().next().unwrap_or(' ');
            write!(writer, "\\u{:04x}", u32::from(c))?;
            rest = &rest[at + c.len_utf8()..];
        }
        writer.write_all(rest.as_bytes())
    }

    fn begin_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_array(w)
    }
    fn end_array<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array(w)
    }
    fn begin_array_value<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_array_value(w, first)
    }
    fn end_array_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_array_value(w)
    }
    fn begin_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object(w)
    }
    fn end_object<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object(w)
    }
    fn begin_object_key<W: ?Sized + io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> io::Result<()> {
        self.0.begin_object_key(w, first)
    }
    fn end_object_key<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_key(w)
    }
    fn begin_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.begin_object_value(w)
    }
    fn end_object_value<W: ?Sized + io::Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.0.end_object_value(w)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_written_as_their_escapes() {
        assert_eq!(one_line("plain"), "plain");
        assert!(matches!(one_line("plain"), Cow::Borrowed(_)));
        assert_eq!(
            one_line("a\u{1b}[31mred\nb\0c\rd\u{9b}"),
            "a\\u{1b}[31mred\\nb\\0c\\rd\\u{9b}"
        );
        assert_eq!(lines("one\n\ttwo\u{7}\r\n"), "one\n\ttwo\\u{7}\\r\n");
        // What reorders or hides text without being seen is shown too.
        assert_eq!(
            one_line("evil\u{202e}gnp.exe\u{200b}\u{2028}"),
            "evil\\u{202e}gnp.exe\\u{200b}\\u{2028}"
        );
        let escaped = lines("\u{1b}]0;title\u{7}");
        assert!(!escaped.chars().any(char::is_control), "{escaped}");
    }

    #[test]
    fn json_keeps_the_data_exact_and_writes_no_control_character_raw() {
        let text = "a\u{1b}[2J\u{0}\u{7f}\u{9b}é\n\"";
        for pretty in [false, true] {
            let written = json(&serde_json::json!({ "t": [text] }), pretty).unwrap();
            assert!(
                !written.chars().any(|c| c.is_control() && c != '\n'),
                "{written}"
            );
            let back: serde_json::Value = serde_json::from_str(&written).unwrap();
            assert_eq!(back["t"][0], text);
        }
        assert_eq!(json(&"\u{9b}", false).unwrap(), "\"\\u009b\"");
    }
}
