//! One chunk of a turn as the wire carries it, whole or in parts: a chunk
//! whose `turn.chunk` would not fit in a frame (a model may send one of
//! several MiB) goes as several, each with the chunk's `seq`, its `part`
//! (from 0) and the number of `parts`, whose `text` (or, for a structured
//! chunk, `data_text`: pieces of its JSON) a client joins in order. The
//! notifications and `session.read` cut a chunk the same way, so a client
//! that missed some parts reads them back by their numbers.

use serde_json::{json, Map, Value};
use settle_runtime::SessionId;

/// What a part's params have besides its piece of text.
const PART_ENVELOPE_BYTES: usize = 256;

/// A chunk's payload.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// A text chunk.
    Text(&'a str),
    /// A tool call, reasoning or usage: its kind and its JSON.
    Data { kind: &'a str, json: &'a Value },
}

/// The params of chunk `seq` of turn `turn`: one object when it fits in
/// `budget` bytes (serialized), else its parts, each within `budget`.
pub(crate) fn params(
    id: SessionId,
    turn: u32,
    seq: u32,
    payload: Payload<'_>,
    budget: usize,
) -> Vec<Value> {
    let whole = match payload {
        Payload::Text(text) => json!({ "id": id.get(), "turn": turn, "seq": seq, "text": text }),
        Payload::Data { kind, json } => {
            json!({ "id": id.get(), "turn": turn, "seq": seq, "kind": kind, "data": json })
        }
    };
    let size = whole.to_string().len();
    if size <= budget {
        return vec![whole];
    }
    let (key, text, kind) = match payload {
        Payload::Text(text) => ("text", text.to_owned(), None),
        Payload::Data { kind, json } => ("data_text", json.to_string(), Some(kind)),
    };
    let pieces = split(&text, budget.saturating_sub(PART_ENVELOPE_BYTES).max(64));
    let parts = pieces.len();
    pieces
        .into_iter()
        .enumerate()
        .map(|(part, piece)| {
            let mut params = Map::new();
            params.insert("id".into(), json!(id.get()));
            params.insert("turn".into(), json!(turn));
            params.insert("seq".into(), json!(seq));
            if let Some(kind) = kind {
                params.insert("kind".into(), json!(kind));
            }
            params.insert("part".into(), json!(part));
            params.insert("parts".into(), json!(parts));
            params.insert(key.into(), json!(piece));
            Value::Object(params)
        })
        .collect()
}

/// How many bytes `c` takes in a JSON string, escaped as serde_json does.
fn escaped_len(c: char) -> usize {
    match c {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

/// `text` in pieces of at most `max` bytes once escaped, cut at character
/// boundaries.
fn split(text: &str, max: usize) -> Vec<&str> {
    let mut pieces = Vec::new();
    let (mut start, mut bytes) = (0, 0);
    for (at, c) in text.char_indices() {
        let len = escaped_len(c);
        if bytes + len > max && at > start {
            pieces.push(&text[start..at]);
            (start, bytes) = (at, 0);
        }
        bytes += len;
    }
    pieces.push(&text[start..]);
    pieces
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_chunk_past_the_budget_goes_in_parts_that_each_fit_and_join_back() {
        let id = SessionId(3);
        let small = params(id, 1, 0, Payload::Text("hi"), 1024);
        assert_eq!(
            small,
            [json!({ "id": 3, "turn": 1, "seq": 0, "text": "hi" })]
        );

        let text = format!("{}é\"\u{1}", "x".repeat(5000)).repeat(3);
        let parts = params(id, 1, 4, Payload::Text(&text), 1024);
        assert!(parts.len() > 10);
        let mut joined = String::new();
        for (i, part) in parts.iter().enumerate() {
            assert!(part.to_string().len() <= 1024, "{}", part.to_string().len());
            assert_eq!(part["seq"], 4);
            assert_eq!(part["part"], i);
            assert_eq!(part["parts"], parts.len());
            joined.push_str(part["text"].as_str().unwrap());
        }
        assert_eq!(joined, text);

        let data = json!({ "arguments": "y".repeat(4000) });
        let parts = params(
            id,
            2,
            0,
            Payload::Data {
                kind: "tool_call",
                json: &data,
            },
            1024,
        );
        let joined: String = parts
            .iter()
            .map(|p| p["data_text"].as_str().unwrap())
            .collect();
        assert_eq!(serde_json::from_str::<Value>(&joined).unwrap(), data);
        assert!(parts.iter().all(|p| p["kind"] == "tool_call"));
    }
}
