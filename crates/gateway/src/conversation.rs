//! [`Conversation`]: what the gateway keeps of a session's exchange to send
//! with its next turn, and [`HeldHistory`], the bytes every session's keeps
//! in memory at once.
//!
//! The kernel bounds one session's history (`max_history_bytes`, 16 MiB by
//! default) and the sessions (`--max-sessions`), but not their product:
//! a client filling a thousand sessions with sixteen prompts of a megabyte
//! each made the gateway hold about 19 GiB. So the gateway counts the
//! bytes its conversations hold, and a `turn.start` whose prompt would
//! take them past `--max-history-memory` is refused `over_capacity`,
//! before anything is written. A conversation gives its bytes back when
//! its session leaves the table (it is finalized). A reply joins its
//! conversation unchecked (its turn already ran): the count may pass the
//! bound by the replies of the turns running at once, each bounded by
//! `max_turn_bytes`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use settle_stream::Message;

/// The bytes all conversations hold, and how many they may.
#[derive(Debug, Default)]
pub(crate) struct HeldHistory {
    held: AtomicUsize,
    /// `None`: no bound.
    limit: Option<usize>,
}

impl HeldHistory {
    /// A count bounded by `limit` bytes (`None`: unbounded).
    pub fn new(limit: Option<usize>) -> Arc<Self> {
        Arc::new(HeldHistory {
            held: AtomicUsize::new(0),
            limit,
        })
    }

    /// Whether `bytes` more may be held; the bound when not.
    pub fn room_for(&self, bytes: usize) -> Result<(), usize> {
        match self.limit {
            Some(limit) if self.held().saturating_add(bytes) > limit => Err(limit),
            _ => Ok(()),
        }
    }

    /// The bytes held now.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }
}

/// One session's messages so far, oldest first, counted in its gateway's
/// [`HeldHistory`] until dropped.
#[derive(Debug)]
pub(crate) struct Conversation {
    messages: Vec<Message>,
    bytes: usize,
    counted: Arc<HeldHistory>,
}

impl Conversation {
    /// An empty conversation counted in `counted`.
    pub fn new(counted: Arc<HeldHistory>) -> Self {
        Conversation {
            messages: Vec::new(),
            bytes: 0,
            counted,
        }
    }

    /// The messages, oldest first.
    pub fn messages(&self) -> &[Message] {
        &self.messages
    }

    /// Adds `message` at the end.
    pub fn push(&mut self, message: Message) {
        let bytes = size_of(&message);
        self.bytes = self.bytes.saturating_add(bytes);
        self.counted.held.fetch_add(bytes, Ordering::Relaxed);
        self.messages.push(message);
    }

    /// Replaces every message with `messages` (an adopted session's).
    pub fn replace(&mut self, messages: Vec<Message>) {
        self.counted.held.fetch_sub(self.bytes, Ordering::Relaxed);
        self.messages.clear();
        self.bytes = 0;
        for message in messages {
            self.push(message);
        }
    }
}

impl Drop for Conversation {
    fn drop(&mut self) {
        self.counted.held.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

/// What a message holds, as counted: its text.
pub(crate) fn size_of(message: &Message) -> usize {
    message.content.len()
}

#[cfg(test)]
mod tests {
    use settle_stream::Role;

    use super::*;

    #[test]
    fn conversations_count_their_bytes_until_dropped_and_the_bound_refuses_past_it() {
        let held = HeldHistory::new(Some(10));
        let mut a = Conversation::new(held.clone());
        a.push(Message::new(Role::User, "12345"));
        let mut b = Conversation::new(held.clone());
        b.push(Message::new(Role::User, "123"));
        assert_eq!(held.held(), 8);
        assert_eq!(held.room_for(2), Ok(()));
        assert_eq!(held.room_for(3), Err(10));
        b.replace(vec![Message::new(Role::User, "1")]);
        assert_eq!(held.held(), 6);
        drop(a);
        assert_eq!(held.held(), 1);
        drop(b);
        assert_eq!(held.held(), 0);
        assert_eq!(HeldHistory::new(None).room_for(usize::MAX), Ok(()));
    }
}
