//! The size limits of a turn's request ([`Config::max_prompt_bytes`],
//! [`Config::max_history_bytes`]), checked when the turn is asked for,
//! before the core admits it: a refused turn sends nothing to the provider
//! and writes nothing (no turn row, no transition).

use settle_stream::{Message, Request, Role};

use crate::config::Config;
use crate::error::RuntimeError;

/// The limits a kernel checks every turn's request against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InputLimits {
    /// The largest one message may be, in bytes.
    prompt: Option<usize>,
    /// The largest the whole request may be, in bytes.
    history: Option<usize>,
}

impl InputLimits {
    /// The limits `config` sets.
    pub fn of(config: &Config) -> Self {
        InputLimits {
            prompt: config.max_prompt_bytes,
            history: config.max_history_bytes,
        }
    }

    /// Refuses `request` if a message the caller wrote, or the whole, is
    /// over its limit. The model's replies sent back with the history are
    /// not held to the per-message limit (one that streamed longer than a
    /// prompt may be would refuse every turn after it); `max_turn_bytes`
    /// bounds them as they stream, and the whole request's limit counts them.
    pub fn check(&self, request: &Request) -> Result<(), RuntimeError> {
        let mut total = 0_usize;
        for message in &request.messages {
            let size = bytes(message);
            let written = message.role != Role::Assistant;
            if let Some(limit) = self.prompt.filter(|&limit| written && size > limit) {
                return Err(RuntimeError::TooLarge {
                    what: "a message of the turn",
                    setting: "max_prompt_bytes",
                    size,
                    limit,
                });
            }
            total = total.saturating_add(size);
        }
        match self.history.filter(|&limit| total > limit) {
            Some(limit) => Err(RuntimeError::TooLarge {
                what: "the turn's whole request",
                setting: "max_history_bytes",
                size: total,
                limit,
            }),
            None => Ok(()),
        }
    }
}

/// The bytes of `message` that count: its content (as the parts it was
/// given in, as JSON, when it was), its tool calls as JSON and the id of
/// the call it answers.
fn bytes(message: &Message) -> usize {
    let json =
        |value: &Option<serde_json::Value>| value.as_ref().map_or(0, |v| v.to_string().len());
    let content = match &message.parts {
        Some(_) => json(&message.parts),
        None => message.content.len(),
    };
    let answers = message.tool_call_id.as_ref().map_or(0, String::len);
    content + json(&message.tool_calls) + answers
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_sent_back_is_held_to_the_whole_requests_limit_only() {
        let limits = InputLimits {
            prompt: Some(10),
            history: Some(100),
        };
        let with = |role: Role, size: usize| {
            Request::new(vec![
                Message::new(Role::User, "hi"),
                Message::new(role, "x".repeat(size)),
                Message::new(Role::User, "and?"),
            ])
        };
        assert!(limits.check(&with(Role::Assistant, 90)).is_ok());
        assert!(limits.check(&with(Role::Assistant, 95)).is_err());
        for role in [Role::User, Role::System, Role::Tool] {
            assert!(limits.check(&with(role, 11)).is_err(), "{role:?}");
        }
    }

    #[test]
    fn a_message_given_as_parts_counts_its_parts() {
        // An image's bytes are in its part, not in the message's text.
        let url = format!("data:image/png;base64,{}", "A".repeat(1000));
        let parts = serde_json::json!([
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": url}},
        ]);
        let message = Message::new(Role::User, "").parts(parts.clone());
        assert_eq!(bytes(&message), parts.to_string().len());
        assert!(bytes(&message) > 1000);
        assert_eq!(bytes(&Message::new(Role::User, "what is this?")), 13);
    }
}
