//! What the store already holds of a session's conversation, so that a turn
//! stores only the messages it adds.
//!
//! # How the runtime knows what is new
//!
//! A caller of [`SessionHandle::run_turn`](crate::SessionHandle::run_turn)
//! sends what the provider must see, as it always has: the whole
//! conversation, or a fresh prompt. It says nothing about what is new. The
//! runtime keeps, per session, a fingerprint (a keyed hash) of what the
//! last turn was sent and of that turn's reply as it was persisted, never
//! the messages themselves. When the next request begins with those
//! messages, and then that reply as an assistant message, the turn's row
//! stores only the messages after them ([`TurnInput::added`]); when it
//! begins with the messages alone (the caller dropped a failed reply, or
//! keeps the reply in its own words, with its tool calls), only the
//! messages after those; otherwise all of it ([`TurnInput::whole`]).
//! Readers rebuild each turn's messages with
//! [`Conversation`](settle_store::Conversation).
//!
//! A fingerprint that does not match only costs space (the turn is stored
//! whole); the fingerprints live in memory, so the first turn a process
//! runs for a session (a resumed session's first, for one) is stored whole.

use std::hash::{BuildHasher, DefaultHasher, Hasher, RandomState};

use settle_store::TurnInput;
use settle_stream::{Message, Role};

/// Ends a string in a fingerprint: no UTF-8 text holds this byte.
const END: u8 = 0xff;

/// The fingerprints of a session's last turn.
#[derive(Debug, Clone)]
pub(crate) struct Sent {
    /// The keys of this session's fingerprints.
    keys: RandomState,
    /// How many messages the last turn was sent.
    len: usize,
    /// The fingerprint of those messages.
    sent: u64,
    /// The fingerprint of those messages, then of an assistant message whose
    /// content is the reply persisted so far (still open: its content grows).
    reply: DefaultHasher,
}

impl Sent {
    /// The reply of the last turn grew by `text` (a text chunk, persisted).
    pub fn reply_text(&mut self, text: &str) {
        self.reply.write(text.as_bytes());
    }

    /// The fingerprint of what the last turn was sent, then its reply.
    fn with_reply(&self) -> u64 {
        let mut reply = self.reply.clone();
        reply.write_u8(END);
        // No tool calls, no call answered: as `Message::new` makes it.
        reply.write_u8(0);
        reply.write_u8(0);
        reply.finish()
    }
}

/// What of `messages` a turn stores, given what the session's previous turn
/// left (`before`), and the fingerprints to keep for the next turn.
pub(crate) fn split(before: Option<&Sent>, messages: &[Message]) -> (TurnInput, Sent) {
    let keys = before.map_or_else(RandomState::new, |b| b.keys.clone());
    let mut hasher = keys.build_hasher();
    let with_reply = before.map(Sent::with_reply);
    let mut from = None;
    for (at, message) in messages.iter().enumerate() {
        if let Some(before) = before {
            if at == before.len && hasher.finish() == before.sent {
                from = Some(at);
            }
            if at == before.len + 1 && Some(hasher.finish()) == with_reply {
                from = Some(at);
            }
        }
        hash_message(&mut hasher, message);
    }
    if let Some(before) = before {
        let len = messages.len();
        if len == before.len && hasher.finish() == before.sent {
            from = Some(len);
        }
        if len == before.len + 1 && Some(hasher.finish()) == with_reply {
            from = Some(len);
        }
    }
    let sent = hasher.finish();
    let mut reply = hasher;
    reply.write(Role::Assistant.as_str().as_bytes());
    reply.write_u8(END);
    let next = Sent {
        keys,
        len: messages.len(),
        sent,
        reply,
    };
    let input = match from.and_then(|k| Some((u32::try_from(k).ok()?, k))) {
        Some((k, at)) => TurnInput::added(k, json(&messages[at..])),
        None => TurnInput::whole(json(messages)),
    };
    (input, next)
}

/// Feeds one message to a fingerprint: its role, content (its parts, when
/// it was given as parts), tool calls and the call it answers, each
/// delimited.
fn hash_message(hasher: &mut DefaultHasher, message: &Message) {
    hasher.write(message.role.as_str().as_bytes());
    hasher.write_u8(END);
    match &message.parts {
        // 0xff is in no UTF-8 text: parts never hash as some text would.
        Some(parts) => {
            hasher.write_u8(0xff);
            hasher.write(parts.to_string().as_bytes());
        }
        None => hasher.write(message.content.as_bytes()),
    }
    hasher.write_u8(END);
    match &message.tool_calls {
        Some(calls) => {
            hasher.write_u8(1);
            hasher.write(calls.to_string().as_bytes());
            hasher.write_u8(END);
        }
        None => hasher.write_u8(0),
    }
    match &message.tool_call_id {
        Some(id) => {
            hasher.write_u8(1);
            hasher.write(id.as_bytes());
            hasher.write_u8(END);
        }
        None => hasher.write_u8(0),
    }
}

/// `messages` as the store keeps them.
fn json(messages: &[Message]) -> serde_json::Value {
    serde_json::to_value(messages).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::new(Role::User, text)
    }

    #[test]
    fn a_request_that_continues_stores_what_it_adds() {
        let first = vec![user("a")];
        let (input, mut sent) = split(None, &first);
        assert_eq!(input.continues, None);
        sent.reply_text("he");
        sent.reply_text("llo");
        // The reply kept.
        let mut second = first.clone();
        second.push(Message::new(Role::Assistant, "hello"));
        second.push(user("b"));
        let (input, _) = split(Some(&sent), &second);
        assert_eq!(input.continues, Some(2));
        assert_eq!(input.messages, json(&second[2..]));
        // The reply dropped.
        let dropped = vec![user("a"), user("b")];
        assert_eq!(split(Some(&sent), &dropped).0.continues, Some(1));
        // The reply changed: only the messages before it are known.
        let edited = vec![user("a"), Message::new(Role::Assistant, "hell"), user("b")];
        assert_eq!(split(Some(&sent), &edited).0.continues, Some(1));
        // Nothing in common.
        assert_eq!(split(Some(&sent), &[user("x")]).0.continues, None);
        // The same request again, nothing added.
        assert_eq!(split(Some(&sent), &first).0.continues, Some(1));
    }

    #[test]
    fn a_message_of_parts_is_not_taken_for_one_of_its_text() {
        let parts = serde_json::json!([
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "https://example.com/1.png"}},
        ]);
        let first = vec![Message::new(Role::User, "").parts(parts.clone())];
        let (_, sent) = split(None, &first);
        // The same text with another image, or none, is not what was sent.
        let other = serde_json::json!([
            {"type": "text", "text": "a"},
            {"type": "image_url", "image_url": {"url": "https://example.com/2.png"}},
        ]);
        for again in [Message::new(Role::User, "").parts(other), user("a")] {
            assert_eq!(again.content, "a");
            assert_eq!(split(Some(&sent), &[again, user("b")]).0.continues, None);
        }
        let same = vec![Message::new(Role::User, "").parts(parts), user("b")];
        assert_eq!(split(Some(&sent), &same).0.continues, Some(1));
    }
}
