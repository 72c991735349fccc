//! What a turn was sent, as the store keeps it: the messages the turn added
//! to its session's conversation, not the whole conversation again.
//!
//! A chat sends its whole history with every turn. Stored whole, the inputs
//! of a session grow with the square of its length (20 turns of 500 KiB
//! prompts once stored 10 MB on the last turn alone); stored as additions
//! they grow with it. A turn's row says which it holds:
//!
//! - `continues: None` — `messages` is everything the turn was sent. Rows
//!   written before additions were kept all read this way, as does the
//!   first turn of a session and any turn whose input does not begin with
//!   the conversation so far (a scripted agent that sends a fresh prompt).
//! - `continues: Some(k)` — the turn was sent the first `k` messages of the
//!   conversation as it stood after the previous turn, then `messages`. The
//!   conversation after a turn is what it was sent followed by its reply as
//!   an assistant message (`{"role": "assistant", "content": <its text
//!   chunks joined>}`); so `k` is that length when the caller kept the
//!   reply, one less when it did not (a failed reply, dropped).
//!
//! [`Conversation`] walks a session's turns in order and gives back what
//! each was sent, rebuilt from these additions.

use serde_json::Value;

use crate::read::TurnRow;

/// The input of one turn as the store keeps it: the messages it added, and
/// where in the conversation they begin ([`Conversation`] reads them back whole).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnInput {
    /// The messages stored: a JSON array, typically of `{role, content}`
    /// (any JSON is kept as given).
    pub messages: Value,
    /// `None` when `messages` is everything the turn was sent; `Some(k)`
    /// when the turn was sent the first `k` messages of the conversation as
    /// the previous turn left it, then `messages`.
    pub continues: Option<u32>,
}

impl TurnInput {
    /// Everything the turn was sent.
    pub fn whole(messages: Value) -> Self {
        TurnInput {
            messages,
            continues: None,
        }
    }

    /// The messages a turn added after the first `from` messages of the
    /// conversation as the previous turn left it.
    pub fn added(from: u32, messages: Value) -> Self {
        TurnInput {
            messages,
            continues: Some(from),
        }
    }
}

/// The conversation of a session, rebuilt turn by turn from what each turn
/// added ([`TurnInput`]) and each turn's reply. Feed it the turns in order.
///
/// ```
/// use serde_json::json;
/// use settle_store::{Conversation, TurnInput};
///
/// let mut conversation = Conversation::new();
/// let first = json!([{"role": "user", "content": "hi"}]);
/// let sent = conversation.next(Some(&TurnInput::whole(first.clone())), "hello!");
/// assert_eq!(sent.map(|m| m.to_vec()), Some(first.as_array().unwrap().clone()));
/// // The second turn kept the reply (2 messages) and added one.
/// let added = TurnInput::added(2, json!([{"role": "user", "content": "and?"}]));
/// let sent = conversation.next(Some(&added), "").unwrap();
/// assert_eq!(sent.len(), 3);
/// assert_eq!(sent[1], json!({"role": "assistant", "content": "hello!"}));
/// ```
#[derive(Debug, Default)]
pub struct Conversation {
    /// What the last turn with an input was sent.
    sent: Vec<Value>,
    /// That turn's reply text.
    reply: String,
    /// Whether `sent` is known (a turn with no input leaves it unknown).
    known: bool,
}

impl Conversation {
    /// Before the first turn.
    pub fn new() -> Self {
        Conversation::default()
    }

    /// What `turn` was sent, its turns before it having been fed in order;
    /// `None` when no input was recorded for it.
    pub fn turn(&mut self, turn: &TurnRow) -> Option<&[Value]> {
        self.next(turn.input.as_ref(), &turn.text())
    }

    /// What the next turn was sent, given its stored `input` and its
    /// `reply` (its text chunks joined); `None` when no input was recorded.
    ///
    /// A turn that continues a conversation this walk does not know (its
    /// previous turn had no input recorded) is given what it added alone.
    pub fn next(&mut self, input: Option<&TurnInput>, reply: &str) -> Option<&[Value]> {
        let previous_reply = std::mem::replace(&mut self.reply, reply.to_owned());
        let Some(input) = input else {
            self.known = false;
            self.sent.clear();
            return None;
        };
        let added = match &input.messages {
            Value::Array(messages) => messages.as_slice(),
            other => std::slice::from_ref(other),
        };
        match input.continues {
            Some(from) if self.known => {
                let from = usize::try_from(from).unwrap_or(usize::MAX);
                if from > self.sent.len() {
                    self.sent
                        .push(serde_json::json!({"role": "assistant", "content": previous_reply}));
                }
                self.sent.truncate(from);
            }
            _ => self.sent.clear(),
        }
        self.sent.extend_from_slice(added);
        self.known = true;
        Some(&self.sent)
    }

    /// The whole conversation after the last turn fed: what it was sent,
    /// then its reply as an assistant message unless `with_reply` is false
    /// or the reply is empty.
    pub fn into_messages(mut self, with_reply: bool) -> Vec<Value> {
        if with_reply && !self.reply.is_empty() {
            self.sent
                .push(serde_json::json!({"role": "assistant", "content": self.reply}));
        }
        self.sent
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn user(text: &str) -> Value {
        json!({"role": "user", "content": text})
    }

    #[test]
    fn additions_rebuild_what_each_turn_was_sent() {
        let mut c = Conversation::new();
        let one = c.next(Some(&TurnInput::whole(json!([user("a")]))), "A");
        assert_eq!(one, Some(&[user("a")][..]));
        // Kept the reply.
        let two = c
            .next(Some(&TurnInput::added(2, json!([user("b")]))), "B")
            .map(<[Value]>::to_vec);
        let assistant = |t: &str| json!({"role": "assistant", "content": t});
        assert_eq!(two, Some(vec![user("a"), assistant("A"), user("b")]));
        // Dropped the failed reply: continues after the 3 messages sent.
        let three = c
            .next(Some(&TurnInput::added(3, json!([user("c")]))), "")
            .map(<[Value]>::to_vec);
        assert_eq!(
            three,
            Some(vec![user("a"), assistant("A"), user("b"), user("c")])
        );
        // An old whole row starts over.
        let four = c
            .next(Some(&TurnInput::whole(json!([user("x")]))), "X")
            .map(<[Value]>::to_vec);
        assert_eq!(four, Some(vec![user("x")]));
        assert_eq!(c.into_messages(true), vec![user("x"), assistant("X")]);
    }

    #[test]
    fn a_turn_without_input_forgets_the_conversation() {
        let mut c = Conversation::new();
        let _ = c.next(Some(&TurnInput::whole(json!([user("a")]))), "A");
        assert_eq!(c.next(None, "B"), None);
        let added = TurnInput::added(3, json!([user("c")]));
        assert_eq!(c.next(Some(&added), ""), Some(&[user("c")][..]));
    }
}
