//! [`Reply`]: what a turn's chunks say, put together by kind.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use settle_core::ChunkKind;

use crate::{Chunk, Message, Role, ToolCall, ToolCalls};

/// A turn's output, put together: the reply text, the model's reasoning,
/// its tool calls whole, its usage reports and any other structured event,
/// each in the order it came.
///
/// ```
/// use serde_json::json;
/// use settle_stream::{Chunk, ChunkKind, Reply};
///
/// let reply = Reply::from_chunks(&[
///     Chunk::text("Let me look."),
///     Chunk::json(ChunkKind::ToolCall, &json!({"index": 0, "id": "c1",
///         "function": {"name": "ls", "arguments": "{}"}})),
///     Chunk::json(ChunkKind::Usage, &json!({"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12})),
/// ]);
/// assert_eq!(reply.text, "Let me look.");
/// assert_eq!(reply.tool_calls[0].name, "ls");
/// assert_eq!(reply.total_tokens(), 12);
/// // The assistant message to send back with the tools' results.
/// assert_eq!(reply.to_message().tool_calls.unwrap()[0]["id"], "c1");
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Reply {
    /// The text chunks joined: the reply a person reads.
    pub text: String,
    /// The reasoning chunks joined (their strings, or their JSON when not one).
    pub reasoning: String,
    /// The tool calls, their streamed pieces put together.
    pub tool_calls: Vec<ToolCall>,
    /// Each usage report, as the provider sent it.
    pub usage: Vec<Value>,
    /// Every other structured chunk's payload.
    pub data: Vec<Value>,
}

/// Puts a [`Reply`] together chunk by chunk.
#[derive(Debug, Clone, Default)]
pub struct ReplyBuilder {
    reply: Reply,
    calls: ToolCalls,
}

impl ReplyBuilder {
    /// Adds a chunk.
    pub fn push(&mut self, chunk: &Chunk) {
        match chunk.as_text() {
            Some(text) => self.reply.text.push_str(text),
            None => self.push_json(chunk.kind(), &chunk.to_json()),
        }
    }

    /// Adds a chunk given by its kind and payload (a stored row's: the text
    /// of a text chunk as a JSON string).
    pub fn push_json(&mut self, kind: ChunkKind, payload: &Value) {
        match kind {
            ChunkKind::Text => match payload {
                Value::String(text) => self.reply.text.push_str(text),
                other => self.reply.text.push_str(&other.to_string()),
            },
            ChunkKind::Reasoning => match payload {
                Value::String(text) => self.reply.reasoning.push_str(text),
                other => self.reply.reasoning.push_str(&other.to_string()),
            },
            ChunkKind::ToolCall => self.calls.push(payload),
            ChunkKind::Usage => self.reply.usage.push(payload.clone()),
            ChunkKind::Data => self.reply.data.push(payload.clone()),
        }
    }

    /// The reply so far.
    pub fn finish(self) -> Reply {
        Reply {
            tool_calls: self.calls.finish(),
            ..self.reply
        }
    }
}

impl Reply {
    /// The reply of these chunks.
    pub fn from_chunks<'a>(chunks: impl IntoIterator<Item = &'a Chunk>) -> Self {
        let mut builder = ReplyBuilder::default();
        for chunk in chunks {
            builder.push(chunk);
        }
        builder.finish()
    }

    /// Whether the turn produced nothing at all.
    pub fn is_empty(&self) -> bool {
        self.text.is_empty()
            && self.reasoning.is_empty()
            && self.tool_calls.is_empty()
            && self.usage.is_empty()
            && self.data.is_empty()
    }

    /// The tokens the usage reports count, summed (`total_tokens`, or
    /// prompt plus completion tokens when a report has no total).
    pub fn total_tokens(&self) -> u64 {
        self.usage
            .iter()
            .map(usage_tokens)
            .fold(0, u64::saturating_add)
    }

    /// The reply as the assistant message of the conversation: its text,
    /// and its tool calls when it made some (what the next turn sends back
    /// with each tool's [`Message::tool_result`]).
    pub fn to_message(&self) -> Message {
        let message = Message::new(Role::Assistant, self.text.clone());
        if self.tool_calls.is_empty() {
            return message;
        }
        message.tool_calls(Value::Array(
            self.tool_calls.iter().map(ToolCall::to_json).collect(),
        ))
    }
}

/// The tokens one usage report counts.
pub fn usage_tokens(usage: &Value) -> u64 {
    // A count past what a `u64` holds arrives as a float (JSON has one kind
    // of number), as may one a server writes `100.0`: counted, saturated,
    // never dropped (a budget must not miss a report it was sent).
    // A count written as its digits (a Python int past 64 bits is kept so)
    // is read the same way.
    let field = |name: &str| {
        usage.get(name).and_then(|n| match (n.as_u64(), n) {
            (Some(n), _) => Some(n),
            (None, Value::String(digits)) => count_of_digits(digits),
            // Up, never under (a budget must not count 10.5 as 10); `as`
            // saturates, and a negative or NaN count is none.
            (None, _) => n.as_f64().map(|f| f.ceil() as u64),
        })
    };
    field("total_tokens").unwrap_or_else(|| {
        // A server's numbers, however large: saturated, never wrapped (a
        // budget's count must not come back under its limit).
        field("prompt_tokens")
            .unwrap_or(0)
            .saturating_add(field("completion_tokens").unwrap_or(0))
    })
}

/// A count written as decimal digits (a leading `-`: none), saturated.
fn count_of_digits(text: &str) -> Option<u64> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    match negative {
        true => Some(0),
        false => Some(digits.parse().unwrap_or(u64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tokens_past_what_a_u64_holds_saturate_and_never_wrap() {
        let max = u64::MAX;
        let usage = json!({"prompt_tokens": max, "completion_tokens": max});
        assert_eq!(usage_tokens(&usage), max);
        assert_eq!(
            usage_tokens(&json!({"prompt_tokens": 3, "completion_tokens": 4})),
            7
        );
        let mut reply = ReplyBuilder::default();
        for _ in 0..2 {
            reply.push_json(ChunkKind::Usage, &json!({"total_tokens": max}));
        }
        assert_eq!(reply.finish().total_tokens(), max);
        // Found from outside: a count past 2^64 (a float once read), or a
        // float, counted none, and a budget of tokens let the next turn go.
        for (total, tokens) in [
            (json!(18_446_744_073_709_551_617_f64), max),
            (json!(1.5e300), max),
            (json!(100.0), 100),
            (json!(10.5), 11),
            (json!(-5), 0),
            (json!("18446744073709551617"), max),
            (json!("-18446744073709551617"), 0),
            (json!("12"), 12),
        ] {
            assert_eq!(usage_tokens(&json!({ "total_tokens": total })), tokens);
        }
    }
}
