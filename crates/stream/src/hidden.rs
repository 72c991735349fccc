//! Characters that change how a terminal shows the text around them
//! without being seen themselves: what every message quoting text from
//! elsewhere (a model server's words, a model's reply on a terminal)
//! writes as its escape.

/// Whether `c` would change how a terminal shows the text around it
/// without being seen itself: a control character, or a bidirectional
/// override or isolate, a zero-width character, a line or paragraph
/// separator (a name with U+202E reads backwards from there on), or a
/// character drawn as nothing (a soft hyphen, a Hangul filler, the
/// interlinear annotation marks, the tag characters that can spell hidden
/// ASCII).
///
/// ```
/// assert!(settle_stream::hides('\u{1b}'));
/// assert!(settle_stream::hides('\u{202e}'));
/// assert!(settle_stream::hides('\u{e0041}')); // TAG LATIN CAPITAL LETTER A
/// assert!(settle_stream::hides('\u{ad}'));
/// assert!(!settle_stream::hides('é'));
/// assert!(!settle_stream::hides('\u{fe0f}')); // an emoji's presentation
/// ```
pub fn hides(c: char) -> bool {
    c.is_control()
        || matches!(
            c,
            '\u{00AD}'
                | '\u{034F}'
                | '\u{061C}'
                | '\u{115F}'..='\u{1160}'
                | '\u{17B4}'..='\u{17B5}'
                | '\u{180B}'..='\u{180F}'
                | '\u{200B}'..='\u{200F}'
                | '\u{2028}'..='\u{202E}'
                | '\u{2060}'..='\u{2064}'
                | '\u{2066}'..='\u{2069}'
                | '\u{3164}'
                | '\u{FEFF}'
                | '\u{FFA0}'
                | '\u{FFF9}'..='\u{FFFB}'
                | '\u{E0000}'..='\u{E007F}'
        )
}
