//! [`ToolCall`]: a tool call the model made, put together from the pieces
//! it streamed, and [`ToolCalls`], which puts them together.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// A tool call the model made, whole: which call, which function, with
/// what arguments.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id, which its result names
    /// ([`Message::tool_result`](crate::Message::tool_result)); empty when
    /// the provider gave none.
    pub id: String,
    /// The function called; empty when no piece named it.
    pub name: String,
    /// Its arguments as the model wrote them: usually JSON text, not
    /// checked (a model can write invalid JSON; the tool says so).
    pub arguments: String,
}

impl ToolCall {
    /// A call of `name` with `arguments`.
    pub fn new(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<String>,
    ) -> Self {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    /// The arguments parsed as JSON.
    ///
    /// # Errors
    /// When the model's arguments are not valid JSON.
    pub fn parse_arguments(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(&self.arguments)
    }

    /// The arguments on one line: compact JSON when they are JSON, else the
    /// text with its line breaks made spaces.
    pub fn arguments_line(&self) -> String {
        match self.parse_arguments() {
            Ok(value) => value.to_string(),
            Err(_) => self.arguments.replace(['\r', '\n'], " "),
        }
    }

    /// The call as chat-completion APIs spell it on the assistant message
    /// that made it: `{"id", "type": "function", "function": {"name",
    /// "arguments"}}`.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }

    /// A call from that spelling (or a streamed piece of one), when it has
    /// a `function` or a name.
    pub fn from_json(value: &Value) -> Self {
        let function = value.get("function").unwrap_or(value);
        ToolCall {
            id: text(value.get("id")),
            name: text(function.get("name")),
            arguments: match function.get("arguments") {
                Some(Value::String(text)) => text.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            },
        }
    }
}

fn text(value: Option<&Value>) -> String {
    value
        .and_then(Value::as_str)
        .map(str::to_owned)
        .unwrap_or_default()
}

/// Puts streamed tool-call pieces together, in the order the calls began.
///
/// A streamed tool call comes in pieces (OpenAI's `delta.tool_calls`, one
/// [`ChunkKind::ToolCall`](crate::ChunkKind::ToolCall) chunk each): the
/// first names the call (`index`, `id`, `function.name`), the next ones
/// carry the same `index` and more of `function.arguments`. A piece joins
/// the last call of its index unless it starts a new one (a different
/// `id`); a piece without an index is a call of its own.
///
/// ```
/// use serde_json::json;
/// use settle_stream::{ToolCall, ToolCalls};
///
/// let mut calls = ToolCalls::default();
/// calls.push(&json!({"index": 0, "id": "call_1", "function": {"name": "ls", "arguments": ""}}));
/// calls.push(&json!({"index": 0, "function": {"arguments": "{\"path\":"}}));
/// calls.push(&json!({"index": 0, "function": {"arguments": "\"/tmp\"}"}}));
/// assert_eq!(calls.finish(), [ToolCall::new("call_1", "ls", r#"{"path":"/tmp"}"#)]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct ToolCalls {
    calls: Vec<ToolCall>,
    // The position in `calls` of the last call of each stream index: a
    // map, so that a reply of many calls costs each piece one lookup.
    open: std::collections::HashMap<u64, usize>,
}

impl ToolCalls {
    /// Adds one streamed piece (a tool-call chunk's JSON).
    pub fn push(&mut self, piece: &Value) {
        let index = piece.get("index").and_then(Value::as_u64);
        let part = ToolCall::from_json(piece);
        let open = index.and_then(|index| self.open.get(&index).copied());
        let joins = open.filter(|&at| part.id.is_empty() || self.calls[at].id == part.id);
        match joins {
            Some(at) => {
                let call = &mut self.calls[at];
                if call.name.is_empty() {
                    call.name = part.name;
                }
                call.arguments.push_str(&part.arguments);
            }
            None => {
                if let Some(index) = index {
                    self.open.insert(index, self.calls.len());
                }
                self.calls.push(part);
            }
        }
    }

    /// The calls put together so far.
    pub fn calls(&self) -> &[ToolCall] {
        &self.calls
    }

    /// Whether no piece was pushed.
    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// The calls, whole.
    pub fn finish(self) -> Vec<ToolCall> {
        self.calls
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_of_two_interleaved_calls_are_put_together_by_index() {
        let mut calls = ToolCalls::default();
        for piece in [
            json!({"index": 0, "id": "a", "type": "function", "function": {"name": "ls", "arguments": ""}}),
            json!({"index": 1, "id": "b", "function": {"name": "cat", "arguments": "{\"f"}}),
            json!({"index": 0, "function": {"arguments": "{}"}}),
            json!({"index": 1, "function": {"arguments": "\":1}"}}),
        ] {
            calls.push(&piece);
        }
        assert_eq!(
            calls.finish(),
            [
                ToolCall::new("a", "ls", "{}"),
                ToolCall::new("b", "cat", "{\"f\":1}")
            ]
        );
    }

    #[test]
    fn a_new_id_at_a_used_index_starts_a_new_call() {
        let mut calls = ToolCalls::default();
        calls.push(&json!({"index": 0, "id": "a", "function": {"name": "x", "arguments": "1"}}));
        calls.push(&json!({"index": 0, "id": "b", "function": {"name": "y", "arguments": "2"}}));
        calls.push(&json!({"function": {"name": "z", "arguments": {"k": 1}}}));
        let calls = calls.finish();
        assert_eq!(calls.len(), 3);
        assert_eq!(calls[1], ToolCall::new("b", "y", "2"));
        assert_eq!(calls[2].arguments, r#"{"k":1}"#);
    }

    #[test]
    fn a_piece_joins_the_last_call_of_its_index_among_many() {
        // Found by index, not by a walk of every call opened so far.
        let mut calls = ToolCalls::default();
        let n = 10_000_u64;
        for i in 0..n {
            calls.push(&json!({"index": i, "id": format!("c{i}"), "function": {"name": "f", "arguments": "["}}));
        }
        calls
            .push(&json!({"index": 7, "id": "again", "function": {"name": "g", "arguments": "("}}));
        for i in (0..n).rev() {
            calls.push(&json!({"index": i, "function": {"arguments": "]"}}));
        }
        let calls = calls.finish();
        assert_eq!(calls.len(), n as usize + 1);
        assert!(calls[..n as usize].iter().enumerate().all(
            |(i, c)| c.id == format!("c{i}") && c.arguments == if i == 7 { "[" } else { "[]" }
        ));
        assert_eq!(calls[n as usize], ToolCall::new("again", "g", "(]"));
    }

    #[test]
    fn a_call_round_trips_through_its_message_spelling() {
        let call = ToolCall::new("c1", "weather", r#"{"city": "Paris"}"#);
        assert_eq!(ToolCall::from_json(&call.to_json()), call);
        assert_eq!(call.arguments_line(), r#"{"city":"Paris"}"#);
        assert_eq!(call.parse_arguments().unwrap_or_default()["city"], "Paris");
    }
}
