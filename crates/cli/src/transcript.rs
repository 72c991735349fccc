//! A turn as people and scripts read it: the input that was sent, the reply
//! as one flowing text, what else the model sent (reasoning, tool calls,
//! usage: [`Reply`]), how it ended and, for a failed turn, why.
//!
//! [`inputs`], [`error`] and [`reply`] are the one place that reads a turn's
//! input, error and output from the store's rows. The store keeps what each
//! turn added to the conversation; [`inputs`] rebuilds what each was sent.
//! A turn written before the store kept input and error has none: `show`
//! and `export md` leave them out, `show --json` and `export jsonl` give
//! null.
//!
//! ```
//! use settle_cli::transcript::{new_messages, InputMessage};
//!
//! let first = vec![InputMessage::new("user", "hi")];
//! let second = vec![
//!     InputMessage::new("user", "hi"),
//!     InputMessage::new("assistant", "hello!"),
//!     InputMessage::new("user", "how are you?"),
//! ];
//! // A chat sends its whole history each turn: only the last message is new.
//! assert_eq!(new_messages(Some((&first, "hello!")), &second), &second[2..]);
//! ```

use serde::Serialize;
use serde_json::Value;
use settle_store::{ChunkRow, Conversation, TurnRow};

/// One message of a turn's input: who wrote it and what it says, and for
/// a tool call's round trip, the calls an assistant message made or the
/// call a tool message answers.
///
/// As JSON it is spelled as it was sent: `content` the parts, for a content
/// sent as parts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(into = "SentMessage")]
pub struct InputMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// What it says (for a content sent as parts, its text parts joined).
    pub content: String,
    /// The content as the parts it was sent in (text, images, files), when
    /// it was.
    pub parts: Option<Value>,
    /// The tool calls of an assistant message, as the provider's JSON.
    pub tool_calls: Option<Value>,
    /// The call a tool message answers.
    pub tool_call_id: Option<String>,
    /// Which participant of its role wrote it (the API's `name`), when given.
    pub name: Option<String>,
}

/// An [`InputMessage`] spelled as it was sent.
#[derive(Serialize)]
struct SentMessage {
    role: String,
    content: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

impl From<InputMessage> for SentMessage {
    fn from(message: InputMessage) -> Self {
        SentMessage {
            role: message.role,
            content: message.parts.unwrap_or(Value::String(message.content)),
            tool_calls: message.tool_calls,
            tool_call_id: message.tool_call_id,
            name: message.name,
        }
    }
}

impl InputMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        InputMessage {
            role: role.into(),
            content: content.into(),
            parts: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    /// Who wrote it, for people: its role, and its `name` when it has one
    /// (`user (alice)`).
    pub fn speaker(&self) -> String {
        match &self.name {
            Some(name) => format!("{} ({name})", self.role),
            None => self.role.clone(),
        }
    }

    /// What it says, for people: its text, and a `[type]` line for each
    /// part it was sent with that has no text (`[image_url]`, `[file]`).
    pub fn shown(&self) -> String {
        let others = self
            .parts
            .iter()
            .flat_map(|parts| parts.as_array().into_iter().flatten());
        let others = others.filter_map(|part| {
            let kind = part.get("type").and_then(Value::as_str)?;
            (kind != "text").then(|| format!("[{kind}]"))
        });
        let lines: Vec<String> = std::iter::once(self.content.clone())
            .filter(|text| !text.is_empty())
            .chain(others)
            .collect();
        lines.join("\n")
    }

    /// A message as the store keeps it (`{role, content, ...}`).
    fn from_json(message: &Value) -> Self {
        let text = |key: &str| message.get(key).and_then(Value::as_str);
        let parts = message.get("content").filter(|c| c.is_array()).cloned();
        let content = match &parts {
            Some(parts) => settle_stream::text_of_parts(parts),
            None => text("content").unwrap_or_default().to_owned(),
        };
        InputMessage {
            parts,
            tool_calls: message.get("tool_calls").filter(|v| !v.is_null()).cloned(),
            tool_call_id: text("tool_call_id").map(str::to_owned),
            name: text("name").map(str::to_owned),
            ..InputMessage::new(text("role").unwrap_or_default(), content)
        }
    }
}

/// Why a turn failed: a kind to sort by (`http_status`, `connect`,
/// `timeout`, ...) and a message a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TurnFailure {
    /// What kind of failure.
    pub kind: String,
    /// What happened, in words.
    pub message: String,
}

/// The messages each of `turns` (a session's, in order) sent to the
/// provider, rebuilt from what each added to the conversation; `None` for a
/// turn whose input the store does not keep.
pub fn inputs(turns: &[TurnRow]) -> Vec<Option<Vec<InputMessage>>> {
    let mut conversation = Conversation::new();
    turns
        .iter()
        .map(|turn| {
            let sent = conversation.turn(turn)?;
            Some(sent.iter().map(InputMessage::from_json).collect())
        })
        .collect()
}

/// Why `turn` failed, where the store keeps it.
pub fn error(turn: &TurnRow) -> Option<TurnFailure> {
    turn.error.as_ref().map(|e| TurnFailure {
        kind: e.kind.as_str().to_owned(),
        message: e.message.clone(),
    })
}

/// The reply of `turn`: its text chunks joined in order, as the model wrote
/// them (tool calls, reasoning and usage are not part of the reply text).
pub fn text(turn: &TurnRow) -> String {
    turn.text()
}

/// A tool call the model made, put together from the pieces it streamed
/// (the library's; see [`settle_stream::ToolCalls`]).
pub use settle_stream::ToolCall;

/// What a turn's output says, by kind (the library's, see
/// [`settle_stream::Reply`]).
pub use settle_stream::Reply;

/// What `turn`'s chunks say, sorted by kind (see [`Reply`]), its streamed
/// tool-call pieces put together by the library's [`settle_stream::ToolCalls`].
pub fn reply(turn: &TurnRow) -> Reply {
    let mut reply = settle_stream::ReplyBuilder::default();
    for chunk in &turn.chunks {
        reply.push_json(chunk.kind, &payload(chunk));
    }
    reply.finish()
}

/// A chunk's structured payload: its data, or its text as a JSON string
/// when it has none.
fn payload(chunk: &ChunkRow) -> Value {
    chunk
        .data
        .clone()
        .unwrap_or_else(|| Value::String(chunk.text.clone()))
}

/// A usage report on one line: `prompt_tokens=5 completion_tokens=7
/// total_tokens=12` (nested values as compact JSON).
pub fn usage_line(usage: &Value) -> String {
    match usage.as_object() {
        Some(fields) => fields
            .iter()
            .map(|(name, value)| match value {
                Value::String(text) => format!("{name}={text}"),
                other => format!("{name}={other}"),
            })
            .collect::<Vec<_>>()
            .join(" "),
        None => usage.to_string(),
    }
}

/// What `input` adds to the conversation after the turn before it: a chat
/// sends its whole history with each turn, so when `input` begins with the
/// previous turn's input (`previous`), only the rest is new, less that
/// turn's reply when it comes next as it was given. Otherwise all of
/// `input` is.
pub fn new_messages<'a>(
    previous: Option<(&[InputMessage], &str)>,
    input: &'a [InputMessage],
) -> &'a [InputMessage] {
    let Some((before, reply)) = previous else {
        return input;
    };
    let history = before.len();
    if input.len() <= history || input[..history] != *before {
        return input;
    }
    let rest = &input[history..];
    match rest.first() {
        Some(next) if *next == InputMessage::new("assistant", reply) => &rest[1..],
        _ => rest,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use settle_store::ChunkKind;

    fn user(text: &str) -> InputMessage {
        InputMessage::new("user", text)
    }

    #[test]
    fn a_message_sent_as_parts_is_shown_as_its_text_and_spelled_as_it_was_sent() {
        let parts = serde_json::json!([
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]);
        let stored = serde_json::json!({"role": "user", "content": parts});
        let message = InputMessage::from_json(&stored);
        assert_eq!(message.content, "What is this?");
        assert_eq!(message.shown(), "What is this?\n[image_url]");
        assert_eq!(serde_json::to_value(&message).unwrap(), stored);
        let text = InputMessage::from_json(&serde_json::json!({"role": "user", "content": "hi"}));
        assert_eq!(text, user("hi"));
        assert_eq!(text.shown(), "hi");
        assert_eq!(
            serde_json::to_value(&text).unwrap(),
            serde_json::json!({"role": "user", "content": "hi"})
        );
    }

    #[test]
    fn a_message_s_name_is_kept_spelled_and_shown_with_its_role() {
        let stored = serde_json::json!({"role": "user", "content": "I vote yes", "name": "alice"});
        let message = InputMessage::from_json(&stored);
        assert_eq!(message.name.as_deref(), Some("alice"));
        assert_eq!(message.speaker(), "user (alice)");
        assert_eq!(serde_json::to_value(&message).unwrap(), stored);
        assert_eq!(user("hi").speaker(), "user");
    }

    #[test]
    fn a_fresh_input_is_all_new() {
        let input = [InputMessage::new("system", "be brief"), user("hi")];
        assert_eq!(new_messages(None, &input), &input);
        // A scripted agent sends a new prompt each turn.
        let earlier = [user("root turn 1")];
        let later = [user("root turn 2")];
        assert_eq!(new_messages(Some((&earlier, "done")), &later), &later);
    }

    fn chunk(seq: u32, kind: ChunkKind, data: Value) -> ChunkRow {
        ChunkRow {
            seq,
            kind,
            text: String::new(),
            data: Some(data),
        }
    }

    #[test]
    fn structured_chunks_are_sorted_by_kind_and_tool_calls_merged() {
        use serde_json::json;
        let chunks = vec![
            chunk(0, ChunkKind::Reasoning, json!("Let me ")),
            chunk(1, ChunkKind::Reasoning, json!("think")),
            ChunkRow {
                seq: 2,
                kind: ChunkKind::Text,
                text: "Sunny".to_owned(),
                data: None,
            },
            chunk(
                3,
                ChunkKind::ToolCall,
                json!({"index": 0, "id": "call_1", "type": "function",
                       "function": {"name": "weather", "arguments": "{\"city\":"}}),
            ),
            chunk(
                4,
                ChunkKind::ToolCall,
                json!({"index": 0, "function": {"arguments": "\"Paris\"}"}}),
            ),
            chunk(
                5,
                ChunkKind::ToolCall,
                json!({"index": 1, "id": "call_2", "function": {"name": "time", "arguments": "{}"}}),
            ),
            // A second call at a used index, with its own id.
            chunk(
                6,
                ChunkKind::ToolCall,
                json!({"index": 0, "id": "call_3", "function": {"name": "news"}}),
            ),
            chunk(
                7,
                ChunkKind::Usage,
                json!({"prompt_tokens": 5, "total_tokens": 12}),
            ),
            chunk(8, ChunkKind::Data, json!({"event": "ping"})),
        ];
        let turn = TurnRow {
            no: 1,
            outcome: None,
            started_at: std::time::SystemTime::UNIX_EPOCH,
            ended_at: None,
            input: None,
            error: None,
            chunks,
        };
        let reply = reply(&turn);
        assert_eq!(reply.text, "Sunny");
        assert_eq!(reply.reasoning, "Let me think");
        let calls: Vec<(&str, &str, &str)> = reply
            .tool_calls
            .iter()
            .map(|c| (c.id.as_str(), c.name.as_str(), c.arguments.as_str()))
            .collect();
        assert_eq!(
            calls,
            [
                ("call_1", "weather", "{\"city\":\"Paris\"}"),
                ("call_2", "time", "{}"),
                ("call_3", "news", ""),
            ]
        );
        assert_eq!(reply.tool_calls[0].arguments_line(), "{\"city\":\"Paris\"}");
        let pretty = ToolCall::new("", "f", "{\n  \"a\": \"x  y\"\n}");
        assert_eq!(pretty.arguments_line(), "{\"a\":\"x  y\"}");
        assert_eq!(
            usage_line(&reply.usage[0]),
            "prompt_tokens=5 total_tokens=12"
        );
        assert_eq!(reply.data, [json!({"event": "ping"})]);
        assert!(!reply.is_empty());
    }

    #[test]
    fn a_reply_kept_in_other_words_or_dropped_is_shown_as_sent() {
        let earlier = [user("hi")];
        let later = [
            user("hi"),
            InputMessage::new("assistant", "edited"),
            user("and?"),
        ];
        assert_eq!(new_messages(Some((&earlier, "hello")), &later), &later[1..]);
        // A failed reply dropped: the prompts after the earlier input.
        let retried = [user("hi"), user("hi again")];
        assert_eq!(
            new_messages(Some((&earlier, "hel")), &retried),
            &retried[1..]
        );
        let other = [user("something else")];
        assert_eq!(new_messages(Some((&earlier, "hello")), &other), &other);
    }
}
