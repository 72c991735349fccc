//! [`openai_chunk_events`]: what one chunk of an OpenAI-compatible stream
//! says, read one way for every path that carries such chunks (the SSE
//! provider's events, and the chunks a Python program's `openai` stream
//! yields).

use serde_json::Value;
use settle_core::ChunkKind;

use crate::{Chunk, StreamError, StreamErrorKind, StreamEvent, Truncation};

/// The items of one OpenAI streaming chunk (the JSON of one `data:` event,
/// or the `openai` package's `ChatCompletionChunk` as JSON), in order:
///
/// - an `error` that is not `null`, `false` or `""`: one
///   [`StreamErrorKind::Provider`] error, its `message` (or the whole
///   error) as `quote` tells it, and nothing else;
/// - `choices[0].delta`: its `reasoning_content` (or `reasoning`) a
///   reasoning chunk, its `content` text (a list of parts: each text part),
///   each of its `tool_calls` a tool-call chunk; a `content` that is
///   neither (a number, an object) is a [`StreamErrorKind::Protocol`]
///   error after what came before it;
/// - `usage` (an object): a usage chunk;
/// - `choices[0].finish_reason` `length` or `content_filter`: after the
///   chunk's own content, a [`StreamErrorKind::Truncated`] error (what was
///   streamed is kept; the reply is not whole);
/// - nothing of these (a role announcement, a bare `stop`): one
///   [`StreamEvent::KeepAlive`], activity without content.
///
/// An error ends the stream: nothing after it is read.
///
/// ```
/// use serde_json::json;
/// use settle_stream::{openai_chunk_events, StreamErrorKind, StreamEvent};
///
/// let chunk = json!({"choices": [{"delta": {"content": "hi"}, "finish_reason": "length"}]});
/// let events = openai_chunk_events(&chunk, &str::to_owned);
/// assert!(matches!(&events[0], Ok(StreamEvent::Chunk(c)) if c.payload() == "hi"));
/// assert!(matches!(&events[1], Err(e) if matches!(e.kind(), StreamErrorKind::Truncated(_))));
/// ```
pub fn openai_chunk_events(
    value: &Value,
    quote: &dyn Fn(&str) -> String,
) -> Vec<Result<StreamEvent, StreamError>> {
    // Some servers send `"error": null` (or `false`) on every event.
    let error = value
        .get("error")
        .filter(|e| !is_empty(e) && **e != Value::Bool(false));
    if let Some(error) = error {
        let message = error
            .get("message")
            .and_then(Value::as_str)
            .map_or_else(|| error.to_string(), str::to_owned);
        let message = quote(&message);
        return vec![Err(StreamErrorKind::Provider { message }.into())];
    }
    let mut out = Vec::new();
    let mut push = |chunk: Chunk| out.push(Ok(StreamEvent::Chunk(chunk)));
    let choice = value.pointer("/choices/0");
    if let Some(delta) = choice.and_then(|c| c.get("delta")) {
        let reasoning = ["reasoning_content", "reasoning"]
            .iter()
            .find_map(|key| delta.get(*key).filter(|v| !is_empty(v)));
        if let Some(reasoning) = reasoning {
            push(Chunk::json(ChunkKind::Reasoning, reasoning));
        }
        match delta.get("content") {
            None | Some(Value::Null) => {}
            Some(Value::String(text)) => {
                if !text.is_empty() {
                    push(Chunk::text(text));
                }
            }
            // Content as parts (as some servers stream it): its text parts.
            Some(Value::Array(parts)) => {
                for part in parts {
                    let text = part
                        .get("text")
                        .filter(|_| part.get("type").is_none_or(|t| t == "text"))
                        .and_then(Value::as_str)
                        .filter(|t| !t.is_empty());
                    if let Some(text) = text {
                        push(Chunk::text(text));
                    }
                }
            }
            // A number, an object: not text, and not to be dropped silently
            // (the turn would end `completed` with a reply it never had).
            Some(other) => {
                let what = quote(&other.to_string());
                out.push(Err(StreamErrorKind::Protocol(format!(
                    "a chunk's delta.content is neither text nor a list of parts: {what}"
                ))
                .into()));
                return out;
            }
        }
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for call in calls {
                push(Chunk::json(ChunkKind::ToolCall, call));
            }
        }
    }
    if let Some(usage) = value.get("usage").filter(|u| u.is_object()) {
        push(Chunk::json(ChunkKind::Usage, usage));
    }
    let truncation = match choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
    {
        Some("length") => Some(Truncation::Length),
        Some("content_filter") => Some(Truncation::ContentFilter),
        // `stop`, `tool_calls`: a whole reply; the stream's end follows.
        _ => None,
    };
    if let Some(truncation) = truncation {
        out.push(Err(StreamErrorKind::Truncated(truncation).into()));
    } else if out.is_empty() {
        out.push(Ok(StreamEvent::KeepAlive));
    }
    out
}

/// A field a server sent empty: `null`, `""`.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}
