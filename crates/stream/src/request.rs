//! What a turn sends to the model: the conversation so far.
//!
//! These types are serde-serializable because a turn's input is part of its
//! transcript (SPEC §1): the runtime stores the messages it sent as JSON, and
//! a resumed session sends them again.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use settle_core::WorkId;

/// Who wrote a message of the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The person (or the agent's caller).
    User,
    /// The model.
    Assistant,
    /// The result of a tool call the model asked for.
    Tool,
}

impl Role {
    /// The spelling chat-completion APIs use.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        }
    }
}

/// One message of the conversation sent to the model.
///
/// Role and content are all most messages need. A framework that runs
/// tools also sends back the model's tool calls (on the assistant message
/// that made them) and each tool's result (a [`Role::Tool`] message naming
/// the call it answers); those fields are passed to the provider as they are.
///
/// ```
/// use serde_json::json;
/// use settle_stream::{Message, Role};
///
/// let history = vec![
///     Message::new(Role::User, "What is in /tmp?"),
///     Message::new(Role::Assistant, "").tool_calls(json!([{
///         "id": "call_1", "type": "function",
///         "function": {"name": "ls", "arguments": "{\"path\":\"/tmp\"}"}
///     }])),
///     Message::tool_result("call_1", "a.txt b.txt"),
/// ];
/// assert_eq!(
///     serde_json::to_value(&history[2]).unwrap(),
///     json!({"role": "tool", "content": "a.txt b.txt", "tool_call_id": "call_1"})
/// );
/// ```
///
/// A content given as parts (the chat-completion spelling of a message with
/// an image or several texts, `[{"type": "text", "text": ...}, {"type":
/// "image_url", ...}]`) is kept as it was given and sent so; `content` is
/// then its text parts joined, which is what a transcript shows:
///
/// ```
/// use serde_json::json;
/// use settle_stream::Message;
///
/// let parts = json!([
///     {"type": "text", "text": "What is in this picture?"},
///     {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
/// ]);
/// let message: Message =
///     serde_json::from_value(json!({"role": "user", "content": parts})).unwrap();
/// assert_eq!(message.content, "What is in this picture?");
/// assert_eq!(message.parts.as_ref(), Some(&parts));
/// assert_eq!(serde_json::to_value(&message).unwrap()["content"], parts);
/// ```
///
/// A message's `name` (one participant of a chat room among others) is
/// kept and sent as given:
///
/// ```
/// use serde_json::json;
/// use settle_stream::Message;
///
/// let said = json!({"role": "user", "name": "alice", "content": "I vote yes"});
/// let message: Message = serde_json::from_value(said.clone()).unwrap();
/// assert_eq!(message.name.as_deref(), Some("alice"));
/// assert_eq!(serde_json::to_value(&message).unwrap(), said);
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "WireMessage", into = "WireMessage")]
#[non_exhaustive]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What it says: its text (for a content given as parts, the text
    /// parts joined, one per line).
    pub content: String,
    /// The content as the parts it was given in, when it was (sent in
    /// place of `content`, as given).
    pub parts: Option<Value>,
    /// The tool calls the model made in this (assistant) message, as the
    /// provider's JSON array.
    pub tool_calls: Option<Value>,
    /// The call this (tool) message answers.
    pub tool_call_id: Option<String>,
    /// Who of several participants of its role wrote it (the API's
    /// `name`: one user of a chat room among others), as given.
    pub name: Option<String>,
}

/// A [`Message`] as the chat-completion API spells it: `content` a string
/// or a list of parts (`null` reads as `""`: an assistant message that
/// only calls tools).
#[derive(Serialize, Deserialize)]
struct WireMessage {
    role: Role,
    #[serde(default)]
    content: Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    name: Option<String>,
}

impl TryFrom<WireMessage> for Message {
    type Error = String;

    fn try_from(wire: WireMessage) -> Result<Self, Self::Error> {
        let (content, parts) = match wire.content {
            Value::String(text) => (text, None),
            Value::Null => (String::new(), None),
            Value::Array(parts) => {
                let parts = Value::Array(parts);
                (text_of_parts(&parts), Some(parts))
            }
            other => {
                return Err(format!(
                    "a message's content must be a string or a list of parts, not {other}"
                ))
            }
        };
        Ok(Message {
            role: wire.role,
            content,
            parts,
            tool_calls: wire.tool_calls,
            tool_call_id: wire.tool_call_id,
            name: wire.name,
        })
    }
}

impl From<Message> for WireMessage {
    fn from(message: Message) -> Self {
        WireMessage {
            role: message.role,
            content: message.parts.unwrap_or(Value::String(message.content)),
            tool_calls: message.tool_calls,
            tool_call_id: message.tool_call_id,
            name: message.name,
        }
    }
}

/// The text of a content given as parts: its `{"type": "text", "text"}`
/// parts (and bare strings) joined, one per line; other parts (images,
/// audio, files) have no text.
pub fn text_of_parts(parts: &Value) -> String {
    let texts = parts.as_array().into_iter().flatten().filter_map(|part| {
        part.as_str().or_else(|| {
            (part.get("type").and_then(Value::as_str) == Some("text"))
                .then(|| part.get("text").and_then(Value::as_str))
                .flatten()
        })
    });
    texts.collect::<Vec<_>>().join("\n")
}

impl Message {
    /// A message from `role`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            parts: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    /// The result of the tool call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }

    /// Sets the content as parts (`[{"type": "text", "text"}, {"type":
    /// "image_url", ...}]`), sent as given; `content` becomes their text.
    pub fn parts(mut self, parts: Value) -> Self {
        self.content = text_of_parts(&parts);
        self.parts = Some(parts);
        self
    }

    /// Sets the tool calls the model made in this message (the provider's
    /// JSON array, passed through).
    pub fn tool_calls(mut self, calls: Value) -> Self {
        self.tool_calls = Some(calls);
        self
    }
}

/// How the model should answer, beside the conversation: the tools it may
/// call, whether it must, the shape of its reply, its sampling.
///
/// Every field is optional and sent only when set; [`extra`](Self::extra)
/// carries any other body field a server knows (`top_p`, `seed`, `stop`,
/// a vendor's own), so a request never needs a new release of this crate.
/// Tools, `tool_choice` and `response_format` are JSON as the
/// chat-completions API spells them, passed through.
///
/// ```
/// use serde_json::json;
/// use settle_stream::{ModelOptions, Request};
///
/// let request = Request::prompt("What is in /tmp?").options(
///     ModelOptions::default()
///         .tools(json!([{"type": "function", "function": {
///             "name": "ls", "parameters": {"type": "object"}}}]))
///         .tool_choice(json!("auto"))
///         .temperature(0.2)
///         .max_tokens(512)
///         .extra("seed", json!(7)),
/// );
/// assert_eq!(request.options.max_tokens, Some(512));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct ModelOptions {
    /// The tools the model may call (`[{"type": "function", "function": {...}}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Value>,
    /// Whether and which tool it must call (`"auto"`, `"required"`, `"none"`,
    /// or `{"type": "function", "function": {"name": ...}}`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// The shape of the reply: `{"type": "json_object"}` or
    /// `{"type": "json_schema", "json_schema": {...}}` (structured outputs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// The sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// The most tokens the reply may have.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    /// Any other body fields, sent as they are; a field named here that the
    /// provider also sets itself (`model`, `messages`, `stream`) is ignored.
    #[serde(default, skip_serializing_if = "Map::is_empty")]
    pub extra: Map<String, Value>,
}

impl ModelOptions {
    /// Whether nothing is set.
    pub fn is_empty(&self) -> bool {
        *self == ModelOptions::default()
    }

    /// Sets the tools the model may call.
    pub fn tools(mut self, tools: Value) -> Self {
        self.tools = Some(tools);
        self
    }

    /// Sets whether and which tool the model must call.
    pub fn tool_choice(mut self, choice: Value) -> Self {
        self.tool_choice = Some(choice);
        self
    }

    /// Sets the shape of the reply (structured outputs).
    pub fn response_format(mut self, format: Value) -> Self {
        self.response_format = Some(format);
        self
    }

    /// Sets the sampling temperature.
    pub fn temperature(mut self, temperature: f32) -> Self {
        self.temperature = Some(temperature);
        self
    }

    /// Sets the most tokens the reply may have.
    pub fn max_tokens(mut self, max: u32) -> Self {
        self.max_tokens = Some(max);
        self
    }

    /// Sets another body field.
    pub fn extra(mut self, name: impl Into<String>, value: Value) -> Self {
        self.extra.insert(name.into(), value);
        self
    }
}

/// What a turn asks the model: the conversation so far, and how to answer.
///
/// Only [`messages`](Self::messages) is the turn's input as a transcript
/// keeps it; [`options`](Self::options) are how it was asked, and
/// [`turn`](Self::turn) is set by the runtime for the provider to read.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Request {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
    /// Tools, structured output, sampling: sent with the messages.
    #[serde(default, skip_serializing_if = "ModelOptions::is_empty")]
    pub options: ModelOptions,
    /// The session and turn this request opens a stream for, set by the
    /// runtime before [`Provider::open`](crate::Provider::open): a provider
    /// wrapper meters, logs or limits per session with it. `None` outside a
    /// runtime (a stream opened by hand).
    #[serde(skip)]
    pub turn: Option<WorkId>,
}

impl Request {
    /// A request of the given messages.
    pub fn new(messages: Vec<Message>) -> Self {
        Request {
            messages,
            ..Request::default()
        }
    }

    /// A request of one user message.
    pub fn prompt(text: impl Into<String>) -> Self {
        Request::new(vec![Message::new(Role::User, text)])
    }

    /// Sets how the model should answer.
    pub fn options(mut self, options: ModelOptions) -> Self {
        self.options = options;
        self
    }

    /// Sets the session and turn the request is for (the runtime does).
    pub fn for_turn(mut self, turn: WorkId) -> Self {
        self.turn = Some(turn);
        self
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::json;

    use super::*;

    #[test]
    fn a_request_round_trips_through_json_with_plain_role_and_content() {
        let request = Request::new(vec![
            Message::new(Role::System, "be brief"),
            Message::new(Role::User, "hi"),
            Message::new(Role::Assistant, "hello"),
        ]);
        let value = serde_json::to_value(&request).unwrap();
        assert_eq!(
            value,
            json!({"messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
            ]})
        );
        assert_eq!(serde_json::from_value::<Request>(value).unwrap(), request);
    }

    #[test]
    fn tool_fields_round_trip() {
        let calls = json!([{"id": "c1", "type": "function",
                            "function": {"name": "ls", "arguments": "{}"}}]);
        let request = Request::new(vec![
            Message::new(Role::Assistant, "").tool_calls(calls.clone()),
            Message::tool_result("c1", "done"),
        ]);
        let text = serde_json::to_string(&request).unwrap();
        let back: Request = serde_json::from_str(&text).unwrap();
        assert_eq!(back, request);
        assert_eq!(back.messages[0].tool_calls, Some(calls));
        assert_eq!(back.messages[1].role, Role::Tool);
        assert_eq!(back.messages[1].tool_call_id.as_deref(), Some("c1"));
        let unknown = serde_json::from_value::<Message>(json!({"role": "robot", "content": ""}));
        assert!(unknown.is_err());
    }

    #[test]
    fn a_content_given_as_parts_is_sent_as_given_and_read_as_its_text() {
        let parts = json!([
            {"type": "text", "text": "Compare these."},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "Which is larger?"},
        ]);
        let message: Message =
            serde_json::from_value(json!({"role": "user", "content": parts})).unwrap();
        assert_eq!(message.content, "Compare these.\nWhich is larger?");
        assert_eq!(message.parts.as_ref(), Some(&parts));
        let sent = serde_json::to_value(Request::new(vec![message.clone()])).unwrap();
        assert_eq!(
            sent["messages"][0],
            json!({"role": "user", "content": parts})
        );
        let back: Request = serde_json::from_value(sent).unwrap();
        assert_eq!(back.messages[0], message);
        // Built in Rust, the same.
        let built = Message::new(Role::User, "ignored").parts(parts.clone());
        assert_eq!(built, message);
        // A text message is spelled as it always was.
        let text = serde_json::to_value(Message::new(Role::User, "hi")).unwrap();
        assert_eq!(text, json!({"role": "user", "content": "hi"}));
    }

    #[test]
    fn a_null_or_missing_content_reads_as_empty_and_any_other_is_refused() {
        let calls = json!([{"id": "c1", "type": "function",
                            "function": {"name": "ls", "arguments": "{}"}}]);
        for message in [
            json!({"role": "assistant", "content": null, "tool_calls": calls}),
            json!({"role": "assistant", "tool_calls": calls}),
        ] {
            let message: Message = serde_json::from_value(message).unwrap();
            assert_eq!(message.content, "");
            assert_eq!(message.parts, None);
            assert_eq!(message.tool_calls.as_ref(), Some(&calls));
        }
        for content in [json!(7), json!({"text": "hi"}), json!(true)] {
            let refused =
                serde_json::from_value::<Message>(json!({"role": "user", "content": content}));
            let error = refused.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(error.contains("a string or a list of parts"), "{error}");
        }
    }
}
