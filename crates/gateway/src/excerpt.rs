//! [`bounded`] and [`bounded_message`]: what an error message may say of a
//! client's input. A message that echoes a request (a serde error quoting a
//! huge string, an unknown method's name) is cut to a bounded excerpt, so
//! that the answer to any request fits in a frame and the connection stays
//! usable.

use std::borrow::Cow;

/// The most characters an error message has, its note of the cut included.
pub(crate) const MAX_MESSAGE_CHARS: usize = 600;

/// The most characters of a client's input quoted in a message.
pub(crate) const MAX_QUOTED_CHARS: usize = 200;

/// `text` if it has at most `max` characters; else as much of its start
/// as fits in `max` characters with `…` and a note of its full length
/// (`… (2000000 characters in all)`), cut at a character boundary. The
/// whole is at most `max` characters, its note included; a bound too small
/// for the note keeps the `…` alone.
pub(crate) fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    if text.char_indices().nth(max).is_none() {
        return Cow::Borrowed(text);
    }
    let total = text.chars().count();
    let mut note = format!("… ({total} characters in all)");
    let mut room = max.checked_sub(note.chars().count());
    if room.is_none() {
        note = "…".to_owned();
        room = max.checked_sub(1);
    }
    let Some(room) = room else {
        return Cow::Borrowed("");
    };
    let cut = text
        .char_indices()
        .nth(room)
        .map_or(text.len(), |(at, _)| at);
    Cow::Owned(format!("{}{note}", &text[..cut]))
}

/// `message` with every run of it between quote marks (`` ` `` or `"`,
/// as serde quotes what it read) cut to [`MAX_QUOTED_CHARS`], and the whole
/// to [`MAX_MESSAGE_CHARS`], the note of its full length included. A run
/// outside quotes is cut the same way: the message's own words are short,
/// and a request with quote marks of its own must not quote more.
pub(crate) fn bounded_message(message: &str) -> Cow<'_, str> {
    let total = message.chars().count();
    if total <= MAX_MESSAGE_CHARS && longest_run(message) <= MAX_QUOTED_CHARS {
        return Cow::Borrowed(message);
    }
    let mut cut = String::new();
    let mut rest = message;
    while !rest.is_empty() {
        let end = rest.find(['`', '"']).map_or(rest.len(), |at| at + 1);
        let (run, after) = rest.split_at(end);
        cut.push_str(&bounded_run(run));
        rest = after;
    }
    let note = format!(" ({total} characters in all)");
    let room = MAX_MESSAGE_CHARS.saturating_sub(note.chars().count() + 1);
    if let Some((at, _)) = cut.char_indices().nth(room) {
        cut.truncate(at);
        cut.push('…');
    }
    cut.push_str(&note);
    Cow::Owned(cut)
}

/// The most characters between two quote marks of `text`.
fn longest_run(text: &str) -> usize {
    text.split(['`', '"'])
        .map(|run| run.chars().count())
        .max()
        .unwrap_or(0)
}

/// A run of a message up to and with its closing quote mark, its text cut
/// to [`MAX_QUOTED_CHARS`].
fn bounded_run(run: &str) -> Cow<'_, str> {
    let (text, mark) = match run.char_indices().last() {
        Some((at, c @ ('`' | '"'))) => (&run[..at], Some(c)),
        _ => (run, None),
    };
    match text.char_indices().nth(MAX_QUOTED_CHARS) {
        None => Cow::Borrowed(run),
        Some((at, _)) => {
            let mut cut = format!("{}…", &text[..at]);
            cut.extend(mark);
            Cow::Owned(cut)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_quotes_at_most_its_bound_and_is_at_most_its_length_note_included() {
        assert_eq!(bounded_message("no method `x`"), "no method `x`");
        let long = "Z".repeat(1000);
        let message = format!("unknown variant `{long}`, expected `turn`");
        let cut = bounded_message(&message);
        assert!(
            cut.starts_with(&format!("unknown variant `{}…`", &long[..200])),
            "{cut}"
        );
        assert!(
            cut.ends_with("`, expected `turn` (1035 characters in all)"),
            "{cut}"
        );
        // Quote marks of the request's own: every run is cut, and the whole.
        let marks = format!("a `{}`", "Q`".repeat(150).repeat(3));
        let cut = bounded_message(&marks);
        assert!(cut.chars().count() <= MAX_MESSAGE_CHARS, "{cut}");
        assert!(longest_run(&cut) <= MAX_QUOTED_CHARS + 1, "{cut}");
        assert!(cut.ends_with(" (904 characters in all)"), "{cut}");
        let words = "word ".repeat(300);
        let cut = bounded_message(&words);
        assert!(cut.chars().count() <= MAX_MESSAGE_CHARS, "{cut}");
    }

    #[test]
    fn a_long_text_is_cut_at_a_character_boundary_with_its_length() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("abc", 3), "abc");
        let long = "é".repeat(100);
        assert_eq!(
            bounded(&long, 30),
            format!("{}… (100 characters in all)", "é".repeat(5))
        );
    }

    /// The whole of what `bounded` gives, its note included, is within its
    /// bound, however long the text and however short the bound.
    #[test]
    fn a_bounded_text_is_at_most_its_bound_note_included() {
        for total in [0, 1, 5, 29, 30, 31, 599, 600, 601, 2_000_000] {
            let text = "E".repeat(total);
            for max in [0, 1, 2, 10, 30, 40, 200, MAX_MESSAGE_CHARS] {
                let cut = bounded(&text, max);
                let chars = cut.chars().count();
                assert!(chars <= max, "{total} in {max}: {chars} characters: {cut}");
                if total <= max {
                    assert_eq!(cut, text);
                } else if max > 0 {
                    assert!(cut.contains('…'), "{total} in {max}: {cut}");
                }
            }
        }
        let huge = "E".repeat(2_000_000);
        let cut = bounded(&huge, MAX_MESSAGE_CHARS);
        assert_eq!(cut.chars().count(), MAX_MESSAGE_CHARS, "{cut}");
        assert!(cut.ends_with("E… (2000000 characters in all)"), "{cut}");
    }
}
