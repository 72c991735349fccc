//! What a turn sends to the model: the conversation so far.
//!
//! These types are serde-serializable because a turn's input is part of its
//! transcript (SPEC §1): the runtime stores the messages it sent as JSON, and
//! a resumed session sends them again.

use serde::{Deserialize, Serialize};
use serde_json::Value;

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
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What it says.
    pub content: String,
    /// The tool calls the model made in this (assistant) message, as the
    /// provider's JSON array.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    /// The call this (tool) message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
        }
    }

    /// The result of the tool call `call_id`.
    pub fn tool_result(call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            tool_call_id: Some(call_id.into()),
            ..Message::new(Role::Tool, content)
        }
    }

    /// Sets the tool calls the model made in this message (the provider's
    /// JSON array, passed through).
    pub fn tool_calls(mut self, calls: Value) -> Self {
        self.tool_calls = Some(calls);
        self
    }
}

/// What a turn asks the model: the conversation so far.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
}

impl Request {
    /// A request of the given messages.
    pub fn new(messages: Vec<Message>) -> Self {
        Request { messages }
    }

    /// A request of one user message.
    pub fn prompt(text: impl Into<String>) -> Self {
        Request {
            messages: vec![Message::new(Role::User, text)],
        }
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
}
