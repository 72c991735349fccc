//! A character split across two items of a turn's source: the high half of a
//! UTF-16 surrogate pair at the end of one string, the low half at the
//! start of the next string in the same place.
//!
//! A server (or a proxy before it) that cuts its text by UTF-16 code units
//! sends an emoji as `"\ud83d"` in one event and `"\ude00"` in the next;
//! each decodes, in Python, to a string with a lone surrogate, which is not
//! UTF-8 and cannot be stored. Read one string at a time, the turn failed
//! where the `openai` package alone reads the reply fine. The high half is
//! held until the next string in the same place (the same key path of an
//! OpenAI-shaped chunk, or the next `str` item) and joined to its low half;
//! a half that nothing completes is still refused, as any lone surrogate.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::errors::BadInput;

/// One step of the path from an item's top to a string in it.
#[derive(Debug)]
pub(crate) enum Step {
    /// A dict's key.
    Key(String),
    /// A list's or a tuple's element: its `index` when it is a dict that
    /// has one (an OpenAI chunk's choice, a tool call's piece: what says
    /// which call a piece continues), else its position.
    At(usize),
}

/// The high surrogates a source's strings ended with, each waiting for the
/// next string in its place.
#[derive(Debug, Default)]
pub(crate) struct SplitSurrogates {
    /// The place (its path, written out) and the high half.
    waiting: Vec<(String, u16)>,
}

impl SplitSurrogates {
    /// `text`, found at `path` in an item, as UTF-8: a pair split across it
    /// and the string before it in the same place joined, a high half it
    /// ends with held for the next one. Raises `BadInput` for a lone
    /// surrogate nothing completes.
    pub(crate) fn text(&mut self, text: &Bound<'_, PyString>, path: &[Step]) -> PyResult<String> {
        if self.waiting.is_empty() {
            if let Ok(text) = text.to_cow() {
                return Ok(text.into_owned());
            }
        }
        let place = place(path);
        let held = self
            .waiting
            .iter()
            .position(|(at, _)| *at == place)
            .map(|i| self.waiting.swap_remove(i).1);
        let mut units = utf16(text)?;
        if units.is_empty() {
            // Nothing between the halves: the high one waits on.
            if let Some(high) = held {
                self.waiting.push((place, high));
            }
            return Ok(String::new());
        }
        if let Some(high) = held {
            match units.first() {
                Some(low) if is_low(*low) => units.insert(0, high),
                _ => return Err(lone_high(high)),
            }
        }
        if let Some(&last) = units.last() {
            if is_high(last) {
                units.pop();
                self.waiting.push((place, last));
            }
        }
        String::from_utf16(&units).map_err(|_| crate::args::not_utf8(text.as_any()))
    }

    /// At the source's end: the error of a high half nothing completed.
    pub(crate) fn left(&self) -> Option<String> {
        self.waiting.first().map(|(_, high)| {
            format!(
                "the source's last string ended with half a character (a lone surrogate \
                 '\\u{high:04x}'), which nothing completed; it cannot be stored"
            )
        })
    }
}

/// `path` written out, to tell places apart.
fn place(path: &[Step]) -> String {
    let mut out = String::new();
    for step in path {
        match step {
            Step::Key(key) => {
                out.push('/');
                out.push_str(key);
            }
            Step::At(at) => {
                out.push('#');
                out.push_str(&at.to_string());
            }
        }
    }
    out
}

/// `text`'s UTF-16 code units, lone surrogates as they are.
fn utf16(text: &Bound<'_, PyString>) -> PyResult<Vec<u16>> {
    let encoded = text.call_method1(
        pyo3::intern!(text.py(), "encode"),
        ("utf-16-le", "surrogatepass"),
    )?;
    let bytes = encoded.cast::<PyBytes>()?.as_bytes();
    Ok(bytes
        .chunks_exact(2)
        .map(|pair| u16::from_le_bytes([pair[0], pair[1]]))
        .collect())
}

fn is_high(unit: u16) -> bool {
    (0xD800..0xDC00).contains(&unit)
}

fn is_low(unit: u16) -> bool {
    (0xDC00..0xE000).contains(&unit)
}

/// The error of a high half the next string in its place did not complete.
fn lone_high(high: u16) -> PyErr {
    BadInput::new_err(format!(
        "a string ended with half a character (a lone surrogate '\\u{high:04x}') that \
         the next string in its place did not complete; it cannot be stored"
    ))
}
