//! The size limits of a turn's request ([`Config::max_prompt_bytes`],
//! [`Config::max_history_bytes`]), checked when the turn is asked for,
//! before the core admits it: a refused turn sends nothing to the provider
//! and writes nothing (no turn row, no transition).

use settle_stream::{Message, Request};

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

    /// Refuses `request` if a message or the whole is over its limit.
    pub fn check(&self, request: &Request) -> Result<(), RuntimeError> {
        let mut total = 0_usize;
        for message in &request.messages {
            let size = bytes(message);
            if let Some(limit) = self.prompt.filter(|&limit| size > limit) {
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
    use settle_stream::Role;

    use super::*;

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
