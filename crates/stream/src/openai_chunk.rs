//! [`OpenAiChunks`]: what the chunks of an OpenAI-compatible stream say,
//! read one way for every path that carries such chunks (the SSE
//! provider's events, and the chunks a Python program's `openai` stream
//! yields).

use serde_json::Value;
use settle_core::ChunkKind;

use crate::{Chunk, StreamError, StreamErrorKind, StreamEvent, Truncation};

/// The reader of one reply's OpenAI streaming chunks (the JSON of each
/// `data:` event, or the `openai` package's `ChatCompletionChunk` as JSON).
/// Each chunk gives, in order:
///
/// - an `error` that is not `null`, `false` or `""`: one
///   [`StreamErrorKind::Provider`] error, its `message` (or the whole
///   error) as `quote` tells it, and nothing else;
/// - `choices[0].delta`: its `reasoning_content` (or `reasoning`) a
///   reasoning chunk, its `content` text (a list of parts: each text part),
///   each of its `tool_calls` a tool-call chunk; a `content` that is
///   neither (a number, an object), a `tool_calls` that is not a list, or
///   a piece of it of no tool call's shape (an `index` that is no whole
///   number, a `function` that is no object, a `name` or `arguments` that
///   is not text) is a [`StreamErrorKind::Protocol`] error after what came
///   before it;
/// - `usage` (an object): a usage chunk;
/// - `choices[0].finish_reason`: [`StreamEvent::Finished`] after the
///   chunk's content, whole (`stop`, `tool_calls`, any but the two below)
///   or cut (`length`, `content_filter`): from a cut on only usage is read
///   (servers send it after the finish), and [`end`](Self::end) says the
///   cut ([`StreamErrorKind::Truncated`]: what was streamed is kept);
/// - nothing of these (a role announcement): one
///   [`StreamEvent::KeepAlive`], activity without content;
/// - a chunk that is not a JSON object, whose `choices` is not a list, or
///   whose first choice or its `delta` is not an object: one
///   [`StreamErrorKind::Protocol`] error.
///
/// An error ends the stream: nothing after it is read.
///
/// ```
/// use serde_json::json;
/// use settle_stream::{OpenAiChunks, StreamErrorKind, StreamEvent};
///
/// let mut reply = OpenAiChunks::default();
/// let cut = json!({"choices": [{"delta": {"content": "hi"}, "finish_reason": "length"}]});
/// let usage = json!({"choices": [], "usage": {"total_tokens": 9}});
/// let events = reply.read(&cut, &str::to_owned);
/// assert!(matches!(&events[0], Ok(StreamEvent::Chunk(c)) if c.payload() == "hi"));
/// assert!(matches!(&events[1], Ok(StreamEvent::Finished(Some(_)))));
/// assert!(matches!(&reply.read(&usage, &str::to_owned)[0], Ok(StreamEvent::Chunk(_))));
/// let end = reply.end().expect("the reply was cut");
/// assert!(matches!(end.kind(), StreamErrorKind::Truncated(_)));
/// ```
#[derive(Debug, Default)]
pub struct OpenAiChunks {
    /// The cut a finish reason said, told at the stream's end.
    cut: Option<Truncation>,
    /// A finish reason said the reply is done (whole or cut).
    finished: bool,
    /// A chunk carried a choice: a reply is under way.
    replying: bool,
}

impl OpenAiChunks {
    /// What `value`, the reply's next chunk, gives (see the type's doc).
    pub fn read(
        &mut self,
        value: &Value,
        quote: &dyn Fn(&str) -> String,
    ) -> Vec<Result<StreamEvent, StreamError>> {
        let replying = value
            .get("choices")
            .and_then(Value::as_array)
            .is_some_and(|choices| !choices.is_empty());
        self.replying |= replying;
        let mut out = decode(value, quote, &mut self.cut, &mut self.finished);
        if out.is_empty() {
            out.push(Ok(StreamEvent::KeepAlive));
        }
        out
    }

    /// Whether a finish reason said the reply was cut.
    pub fn is_cut(&self) -> bool {
        self.cut.is_some()
    }

    /// Whether a finish reason said the reply is done, whole or cut: a
    /// stream that then closes without its end marker (`data: [DONE]`)
    /// ends as that said.
    pub fn is_finished(&self) -> bool {
        self.finished
    }

    /// Whether a reply was under way (a chunk carried a choice) and no
    /// finish reason said it was done: a stream that ends now may have been
    /// cut short (a connection closed mid-reply), which a client that ends
    /// its stream quietly at a close without `[DONE]` (the `openai`
    /// package) does not say.
    pub fn is_unfinished(&self) -> bool {
        self.replying && !self.finished
    }

    /// At the stream's end: the error it ends with when a finish reason
    /// said the reply was cut.
    pub fn end(&mut self) -> Option<StreamError> {
        self.cut
            .take()
            .map(|cut| StreamErrorKind::Truncated(cut).into())
    }
}

fn decode(
    value: &Value,
    quote: &dyn Fn(&str) -> String,
    cut: &mut Option<Truncation>,
    finished: &mut bool,
) -> Vec<Result<StreamEvent, StreamError>> {
    // A chunk is an object, and its `choices` a list: anything else is
    // not a chunk of this protocol, and is not taken for a keepalive (a
    // reply of nothing but such events would end `completed`, empty).
    let malformed = match value {
        Value::Object(fields) => match fields.get("choices") {
            None | Some(Value::Null) => None,
            Some(Value::Array(choices)) => match choices.first() {
                None => None,
                Some(Value::Object(choice)) => match choice.get("delta") {
                    None | Some(Value::Null | Value::Object(_)) => None,
                    Some(other) => Some(format!("a chunk's delta is not an object: {other}")),
                },
                Some(other) => Some(format!("a chunk's choice is not an object: {other}")),
            },
            Some(other) => Some(format!("a chunk's choices is not a list: {other}")),
        },
        other => Some(format!("an event is not a JSON object: {other}")),
    };
    if let Some(malformed) = malformed {
        return vec![Err(StreamErrorKind::Protocol(quote(&malformed)).into())];
    }
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
    let usage = value
        .get("usage")
        .filter(|u| u.is_object())
        .map(|usage| Ok(StreamEvent::Chunk(Chunk::json(ChunkKind::Usage, usage))));
    if cut.is_some() {
        // Past the cut: what the reply spent still counts; nothing else.
        return usage.into_iter().collect();
    }
    let mut out = Vec::new();
    let choice = value.pointer("/choices/0");
    if let Some(delta) = choice.and_then(|c| c.get("delta")) {
        if let Err(error) = read_delta(delta, quote, &mut out) {
            out.push(Err(error));
            return out;
        }
    }
    out.extend(usage);
    match choice
        .and_then(|c| c.get("finish_reason"))
        .and_then(Value::as_str)
    {
        Some("length") => *cut = Some(Truncation::Length),
        Some("content_filter") => *cut = Some(Truncation::ContentFilter),
        // `stop`, `tool_calls`: a whole reply; usage and the end follow.
        Some(_) => {}
        None => return out,
    }
    *finished = true;
    out.push(Ok(StreamEvent::Finished(*cut)));
    out
}

/// The chunks of one `delta`; the error of a `content` that is not text.
fn read_delta(
    delta: &Value,
    quote: &dyn Fn(&str) -> String,
    out: &mut Vec<Result<StreamEvent, StreamError>>,
) -> Result<(), StreamError> {
    let mut push = |chunk: Chunk| out.push(Ok(StreamEvent::Chunk(chunk)));
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
            return Err(StreamErrorKind::Protocol(format!(
                "a chunk's delta.content is neither text nor a list of parts: {what}"
            ))
            .into());
        }
    }
    match delta.get("tool_calls") {
        None | Some(Value::Null) => {}
        Some(Value::Array(calls)) => {
            // Each checked before any is taken: a piece of no tool call's
            // shape would join the history as an empty call, which a
            // server refuses on the next prompt.
            if let Some(bad) = calls.iter().find(|call| !is_tool_call_piece(call)) {
                let what = quote(&bad.to_string());
                return Err(StreamErrorKind::Protocol(format!(
                    "a chunk's delta.tool_calls holds a piece of no tool call's shape: {what}"
                ))
                .into());
            }
            for call in calls {
                push(Chunk::json(ChunkKind::ToolCall, call));
            }
        }
        Some(other) => {
            let what = quote(&other.to_string());
            return Err(StreamErrorKind::Protocol(format!(
                "a chunk's delta.tool_calls is not a list: {what}"
            ))
            .into());
        }
    }
    Ok(())
}

/// Whether `call` has a streamed tool call's shape: an object whose
/// `index` (when there) is a whole number from 0, whose `id` and `type`
/// are text, and whose `function` is an object with text `name` and
/// `arguments`; each may be missing or `null` (later pieces leave them
/// out).
fn is_tool_call_piece(call: &Value) -> bool {
    let Value::Object(call) = call else {
        return false;
    };
    let text_or_none =
        |value: Option<&Value>| matches!(value, None | Some(Value::Null | Value::String(_)));
    let index_ok = match call.get("index") {
        None | Some(Value::Null) => true,
        Some(index) => index.as_u64().is_some(),
    };
    let function_ok = match call.get("function") {
        None | Some(Value::Null) => true,
        Some(Value::Object(function)) => {
            text_or_none(function.get("name")) && text_or_none(function.get("arguments"))
        }
        Some(_) => false,
    };
    index_ok && function_ok && text_or_none(call.get("id")) && text_or_none(call.get("type"))
}

/// A field a server sent empty: `null`, `""`.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn read(delta: Value) -> Vec<Result<StreamEvent, StreamError>> {
        OpenAiChunks::default().read(&json!({ "choices": [{ "delta": delta }] }), &str::to_owned)
    }

    /// Found from outside: tool-call pieces of no tool call's shape (an
    /// index in words, a function that is a number, a name that is a
    /// number, `tool_calls` that is not a list) were taken, and joined the
    /// history as an empty call, or were dropped without a word; a
    /// malformed `content` failed the turn `protocol`. They fail it too.
    #[test]
    fn a_tool_call_piece_of_no_tool_calls_shape_is_a_protocol_error() {
        for delta in [
            json!({ "tool_calls": [{ "index": "zero", "function": 3 }] }),
            json!({ "tool_calls": [{ "index": 0, "id": "c1", "function": { "name": 7 } }] }),
            json!({ "tool_calls": [{ "index": -1 }] }),
            json!({ "tool_calls": [{ "index": 0, "function": { "arguments": { "a": 1 } } }] }),
            json!({ "tool_calls": [{ "index": 0, "id": 5 }] }),
            json!({ "tool_calls": ["x"] }),
            json!({ "tool_calls": "x" }),
            json!({ "tool_calls": { "index": 0 } }),
        ] {
            let events = read(delta.clone());
            assert!(
                matches!(&events[..], [Err(e)] if matches!(e.kind(), StreamErrorKind::Protocol(_))),
                "{delta}: {events:?}"
            );
        }
    }

    /// The pieces servers stream: the first with its id, type and name,
    /// later ones with arguments only, and nulls where a field is absent.
    #[test]
    fn tool_call_pieces_as_servers_stream_them_are_taken() {
        for delta in [
            json!({ "tool_calls": [{ "index": 0, "id": "call_1", "type": "function",
                                     "function": { "name": "ls", "arguments": "" } }] }),
            json!({ "tool_calls": [{ "index": 0, "function": { "arguments": "{\"p\":" } }] }),
            json!({ "tool_calls": [{ "index": 1, "id": null, "type": null,
                                     "function": { "name": null, "arguments": "1}" } }] }),
            json!({ "tool_calls": [{ "id": "call_2", "function": { "name": "cat" } }] }),
        ] {
            let events = read(delta.clone());
            assert!(
                matches!(&events[..], [Ok(StreamEvent::Chunk(c))] if c.kind() == ChunkKind::ToolCall),
                "{delta}: {events:?}"
            );
        }
        assert!(read(json!({ "tool_calls": null, "content": "hi" }))[0].is_ok());
        assert!(read(json!({ "tool_calls": [] })).iter().all(Result::is_ok));
    }
}
