//! [`bounded`]: what an error message may say of a client's input. A
//! message that echoes a request (a serde error quoting a huge string, an
//! unknown method's name) is cut to a bounded excerpt, so that the answer
//! to any request fits in a frame and the connection stays usable.

use std::borrow::Cow;

/// The most characters an error message has, besides its note of the cut.
pub(crate) const MAX_MESSAGE_CHARS: usize = 600;

/// The most characters of a client's input quoted in a message.
pub(crate) const MAX_QUOTED_CHARS: usize = 200;

/// `text` if it has at most `max` characters; else its first `max`,
/// cut at a character boundary, with a note of its full length.
pub(crate) fn bounded(text: &str, max: usize) -> Cow<'_, str> {
    match text.char_indices().nth(max) {
        None => Cow::Borrowed(text),
        Some((cut, _)) => {
            let total = text.chars().count();
            Cow::Owned(format!("{}… ({total} characters in all)", &text[..cut]))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_text_is_cut_at_a_character_boundary_with_its_length() {
        assert_eq!(bounded("short", 10), "short");
        assert_eq!(bounded("ééééé", 2), "éé… (5 characters in all)");
        assert_eq!(bounded("abc", 3), "abc");
    }
}
