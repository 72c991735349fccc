//! Characters that change how a terminal shows the text around them
//! without being seen themselves: what every message quoting text from
//! elsewhere (a model server's words, a model's reply on a terminal)
//! writes as its escape.

/// Whether `c` would change how a terminal shows the text around it
/// without being seen itself: a control character, or a bidirectional
/// override or isolate, a zero-width character, a line or paragraph
/// separator (a name with U+202E reads backwards from there on).
///
/// ```
/// assert!(settle_stream::hides('\u{1b}'));
/// assert!(settle_stream::hides('\u{202e}'));
/// assert!(!settle_stream::hides('é'));
/// ```
pub fn hides(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{061C}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{FEFF}'
        )
}
