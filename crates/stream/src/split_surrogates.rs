//! [`SplitSurrogates`]: a character split across two events of an
//! OpenAI-compatible stream, joined.
//!
//! A server (or a proxy before it) that cuts its text by UTF-16 code units
//! sends an emoji as `"\ud83d"` at the end of one event's string and
//! `"\ude00"` at the start of the next event's string in the same place.
//! Each event alone holds a lone surrogate, which is not a character: JSON
//! parsers refuse it, and the reply failed where the `openai` package reads
//! it whole. The high half is held until the next string in the same place
//! (the same key path; a list's element that is an object with an `index`,
//! as a tool call's piece, is placed by it) and joined to its low half. A
//! half that nothing completes is refused, as any lone surrogate; the
//! Python bridge joins its sources' strings by the same rule.
//!
//! An event that parses costs nothing more while no half is held. One that
//! does not, and holds a surrogate escape, is parsed again with each lone
//! surrogate standing as a private-use character (U+F0000 + its distance
//! from U+D800), which the walk over its strings turns back into code
//! units; an event that holds a real character of that range is refused as
//! it was, not guessed at.

use std::fmt::Write as _;

use serde_json::Value;

/// The private-use character that stands for the lone surrogate U+D800
/// while an event is parsed; U+D800 + n stands as `MARK` + n.
const MARK: u32 = 0xF0000;
/// How many characters stand for surrogates: U+D800 to U+DFFF.
const MARKS: u32 = 0x800;

/// Why an event was refused.
#[derive(Debug)]
pub(crate) enum Refused {
    /// It is not JSON at all.
    NotJson(serde_json::Error),
    /// It holds half a character nothing completes: said in words.
    Lone(String),
}

/// The high halves the strings of a reply's events ended with, each
/// waiting for the next string in its place.
#[derive(Debug, Default)]
pub(crate) struct SplitSurrogates {
    /// The place (its path, written out) and the high half.
    waiting: Vec<(String, u16)>,
}

impl SplitSurrogates {
    /// `data`, one event's JSON, parsed: a character split across it and
    /// the event before in the same place joined, a high half it ends a
    /// string with held for the next.
    pub(crate) fn parse(&mut self, data: &str) -> Result<Value, Refused> {
        let (mut value, marked) = match serde_json::from_str::<Value>(data) {
            Ok(value) if self.waiting.is_empty() => return Ok(value),
            Ok(value) => (value, false),
            Err(error) => {
                let reparsed = marked(data).and_then(|text| serde_json::from_str(&text).ok());
                match reparsed {
                    Some(value) => (value, true),
                    None => return Err(Refused::NotJson(error)),
                }
            }
        };
        let mut place = String::new();
        self.walk(&mut value, &mut place, marked)?;
        Ok(value)
    }

    /// At the reply's end: the words of a high half nothing completed.
    pub(crate) fn left(&self) -> Option<String> {
        self.waiting.first().map(|(_, high)| {
            format!(
                "the reply's last string in its place ended with half a character \
                 (a lone surrogate '\\u{high:04x}'), which nothing completed"
            )
        })
    }

    fn walk(&mut self, value: &mut Value, place: &mut String, marked: bool) -> Result<(), Refused> {
        let len = place.len();
        match value {
            Value::String(text) => self.text(text, place, marked)?,
            Value::Array(items) => {
                for (at, item) in items.iter_mut().enumerate() {
                    let at = item
                        .get("index")
                        .and_then(Value::as_u64)
                        .unwrap_or(at as u64);
                    let _ = write!(place, "#{at}");
                    self.walk(item, place, marked)?;
                    place.truncate(len);
                }
            }
            Value::Object(fields) => {
                for (key, item) in fields.iter_mut() {
                    if marked && key.chars().any(is_mark) {
                        return Err(Refused::Lone(lone(key.chars().find_map(unit_of))));
                    }
                    place.push('/');
                    place.push_str(key);
                    self.walk(item, place, marked)?;
                    place.truncate(len);
                }
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
        Ok(())
    }

    /// One string at `place`: joined to the half held there, its own last
    /// high half held, the rest refused when a lone half remains.
    fn text(&mut self, text: &mut String, place: &str, marked: bool) -> Result<(), Refused> {
        let held = self
            .waiting
            .iter()
            .position(|(at, _)| at == place)
            .map(|i| self.waiting.swap_remove(i).1);
        let has_marks = marked && text.chars().any(is_mark);
        if held.is_none() && !has_marks {
            return Ok(());
        }
        let mut units: Vec<u16> = Vec::with_capacity(text.len());
        for c in text.chars() {
            match unit_of(c) {
                Some(unit) => units.push(unit),
                None => units.extend_from_slice(c.encode_utf16(&mut [0; 2])),
            }
        }
        if units.is_empty() {
            // Nothing between the halves: the high one waits on.
            if let Some(high) = held {
                self.waiting.push((place.to_owned(), high));
            }
            return Ok(());
        }
        if let Some(high) = held {
            match units.first() {
                Some(&low) if is_low(low) => units.insert(0, high),
                _ => {
                    return Err(Refused::Lone(format!(
                        "a string ended with half a character (a lone surrogate \
                         '\\u{high:04x}') that the next string in its place did not complete"
                    )))
                }
            }
        }
        if let Some(&last) = units.last() {
            if is_high(last) {
                units.pop();
                self.waiting.push((place.to_owned(), last));
            }
        }
        match String::from_utf16(&units) {
            Ok(joined) => {
                *text = joined;
                Ok(())
            }
            Err(_) => {
                let first_lone = char::decode_utf16(units.iter().copied())
                    .find_map(|c| c.err().map(|e| e.unpaired_surrogate()));
                Err(Refused::Lone(lone(first_lone)))
            }
        }
    }
}

/// The words for a lone surrogate no neighbour completes.
fn lone(unit: Option<u16>) -> String {
    let unit = unit.map_or_else(String::new, |u| format!(" '\\u{u:04x}'"));
    format!(
        "a string holds half a character (a lone surrogate{unit}), which no neighbour completes"
    )
}

/// `data` with each escape of a lone surrogate written as the private-use
/// character that stands for it; `None` when it has none, or when it holds
/// a real character of that range (which would be taken for one).
fn marked(data: &str) -> Option<String> {
    if data.chars().any(is_mark) {
        return None;
    }
    let bytes = data.as_bytes();
    let mut out = String::new();
    let (mut i, mut copied) = (0, 0);
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            i += 1;
            continue;
        }
        if bytes.get(i + 1) != Some(&b'u') {
            // Any other escape (`\\` among them) is two bytes.
            i += 2;
            continue;
        }
        let Some(unit) = escaped_unit(data, i) else {
            i += 2;
            continue;
        };
        if is_high(unit) {
            if let Some(low) = escaped_unit(data, i + 6).filter(|u| is_low(*u)) {
                let code = 0x10000 + ((u32::from(unit) - 0xD800) << 10) + (u32::from(low) - 0xDC00);
                if (MARK..MARK + MARKS).contains(&code) {
                    return None;
                }
                i += 12;
                continue;
            }
        } else if !is_low(unit) {
            i += 6;
            continue;
        }
        // A lone half: its stand-in, as the escapes of a whole pair.
        out.push_str(&data[copied..i]);
        let code = MARK + (u32::from(unit) - 0xD800) - 0x10000;
        let (high, low) = (0xD800 + (code >> 10), 0xDC00 + (code & 0x3FF));
        let _ = write!(out, "\\u{high:04x}\\u{low:04x}");
        i += 6;
        copied = i;
    }
    if copied == 0 {
        return None;
    }
    out.push_str(&data[copied..]);
    Some(out)
}

/// The code unit of the `\uXXXX` escape at byte `at` of `data`.
fn escaped_unit(data: &str, at: usize) -> Option<u16> {
    if data.get(at..at + 2)? != "\\u" {
        return None;
    }
    u16::from_str_radix(data.get(at + 2..at + 6)?, 16).ok()
}

fn is_mark(c: char) -> bool {
    (MARK..MARK + MARKS).contains(&u32::from(c))
}

/// The surrogate a private-use character stands for.
fn unit_of(c: char) -> Option<u16> {
    let code = u32::from(c);
    (MARK..MARK + MARKS)
        .contains(&code)
        .then(|| u16::try_from(code - MARK + 0xD800).ok())
        .flatten()
}

fn is_high(unit: u16) -> bool {
    (0xD800..0xDC00).contains(&unit)
}

fn is_low(unit: u16) -> bool {
    (0xDC00..0xE000).contains(&unit)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_pair_and_other_escapes_are_left_alone() {
        let mut split = SplitSurrogates::default();
        let value = split
            .parse(r#"{"a":"\ud83d\ude00 \\ud83d \u0041"}"#)
            .map_err(|e| format!("{e:?}"));
        assert_eq!(
            value.ok(),
            Some(serde_json::json!({"a": "\u{1f600} \\ud83d A"}))
        );
        assert!(split.left().is_none());
    }

    #[test]
    fn a_real_character_of_the_stand_ins_range_is_not_guessed_at() {
        let mut split = SplitSurrogates::default();
        let refused = split.parse("{\"a\":\"\u{f0001}\\ud83d\"}");
        assert!(matches!(refused, Err(Refused::NotJson(_))), "{refused:?}");
        let refused = split.parse(r#"{"a":"\udb80\udc01\ud83d"}"#);
        assert!(matches!(refused, Err(Refused::NotJson(_))), "{refused:?}");
    }

    #[test]
    fn a_half_held_in_one_place_waits_through_another_place() {
        let mut split = SplitSurrogates::default();
        assert!(split.parse(r#"{"a":"x\ud83d","b":"y"}"#).is_ok());
        assert!(split.left().is_some());
        let value = split
            .parse(r#"{"b":"z","a":"\ude00"}"#)
            .map_err(|e| format!("{e:?}"));
        assert_eq!(
            value.ok(),
            Some(serde_json::json!({"b": "z", "a": "\u{1f600}"}))
        );
        assert!(split.left().is_none());
    }
}
