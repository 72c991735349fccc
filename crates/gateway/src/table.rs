//! The gateway's session table: for each session its clients may use, the
//! runtime's handle, the conversation sent with each turn, and the
//! connections attached to it (its watchers, each sent the session's
//! notifications).
//!
//! The table decides nothing about the lifecycle: a session leaves it when
//! the kernel says it is finalized, whoever finalized it (a client's close,
//! a sweeper, the shutdown).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::ws::Utf8Bytes;
use settle_runtime::{EndReason, SessionHandle, SessionId};
use tokio_util::sync::CancellationToken;

use crate::conversation::{Conversation, HeldHistory};
use crate::outbox::{Frame, Outbox};

/// Which connection: numbered from 1 in the order they arrive.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct ConnId(pub u64);

/// What the gateway keeps per session.
#[derive(Debug)]
pub(crate) struct Entry {
    pub handle: SessionHandle,
    /// The messages sent so far and the replies, oldest first. Held by the
    /// turn in flight until its end is delivered, so the next turn is sent
    /// the whole exchange.
    pub conversation: Arc<tokio::sync::Mutex<Conversation>>,
    watchers: Mutex<Watchers>,
    /// Cancelled once the watcher of its end is done: its
    /// `session.finalized` was sent, or will never be (handed off, left for
    /// recovery).
    told: CancellationToken,
}

#[derive(Debug, Default)]
struct Watchers {
    attached: Vec<(ConnId, Outbox)>,
    /// Set once the session is finalized: nobody attaches any more.
    finalized: Option<EndReason>,
    /// The `told` of its children the gateway serves, those not told yet
    /// (pruned as children come): its own `session.finalized` is sent
    /// after theirs, as G1 finalizes them first.
    children: Vec<CancellationToken>,
}

impl Entry {
    pub fn new(handle: SessionHandle, held: Arc<HeldHistory>) -> Self {
        Entry {
            handle,
            conversation: Arc::new(tokio::sync::Mutex::new(Conversation::new(held))),
            watchers: Mutex::default(),
            told: CancellationToken::new(),
        }
    }

    /// The watcher of its end is done (see `told`); dropped, it says so.
    pub fn telling(&self) -> tokio_util::sync::DropGuard {
        self.told.clone().drop_guard()
    }

    /// Waits until each child it had when its end was known is told: a
    /// connection attached to both hears the child's `session.finalized`
    /// first, in the order G1 finalized them (their ends, committed in one
    /// batch, wake their watchers in any order).
    pub async fn children_told(&self) {
        let children = std::mem::take(&mut self.watchers().children);
        for child in children {
            child.cancelled().await;
        }
    }

    fn watchers(&self) -> std::sync::MutexGuard<'_, Watchers> {
        self.watchers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends the session's notifications to `conn` from now on; refused
    /// with the end reason once the session is finalized.
    pub fn watch(&self, conn: ConnId, outbox: &Outbox) -> Result<(), EndReason> {
        let mut watchers = self.watchers();
        if let Some(reason) = watchers.finalized {
            return Err(reason);
        }
        if !watchers.attached.iter().any(|(c, _)| *c == conn) {
            watchers.attached.push((conn, outbox.clone()));
        }
        Ok(())
    }

    /// Stops sending to `conn`.
    pub fn unwatch(&self, conn: ConnId) {
        self.watchers().attached.retain(|(c, _)| *c != conn);
    }

    /// Queues `frame` for every attached connection; a connection whose
    /// queue is full is cut (see [`Outbox`]), the others are not held back.
    pub fn notify(&self, frame: &Utf8Bytes) {
        for (_, outbox) in &self.watchers().attached {
            outbox.text(frame.clone());
        }
    }

    /// Queues the parts of one chunk for every attached connection, as
    /// [`notify`](Self::notify) does a frame.
    pub fn notify_parts(&self, parts: &Arc<[Utf8Bytes]>) {
        for (_, outbox) in &self.watchers().attached {
            outbox.push(Frame::Parts(parts.clone()));
        }
    }

    /// Marks the session finalized and sends `frame` (its
    /// `session.finalized`) to every attached connection, for the last time;
    /// each is attached to it no more (so its idle timeout applies again).
    pub fn finalized(&self, reason: EndReason, frame: &Utf8Bytes) {
        let attached = {
            let mut watchers = self.watchers();
            watchers.finalized = Some(reason);
            std::mem::take(&mut watchers.attached)
        };
        for (_, outbox) in attached {
            outbox.text(frame.clone());
            outbox.finalized(self.handle.id());
        }
    }
}

/// The sessions the gateway serves, by id.
#[derive(Debug)]
pub(crate) struct Table {
    entries: Mutex<HashMap<SessionId, Arc<Entry>>>,
    /// The bytes their conversations hold.
    held: Arc<HeldHistory>,
}

impl Table {
    /// An empty table whose conversations may hold `held`'s bound.
    pub fn new(held: Arc<HeldHistory>) -> Self {
        Table {
            entries: Mutex::default(),
            held,
        }
    }

    /// The bytes the conversations hold, and their bound.
    pub fn held(&self) -> &Arc<HeldHistory> {
        &self.held
    }

    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<SessionId, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The entry of `id`, if the gateway serves it.
    pub fn get(&self, id: SessionId) -> Option<Arc<Entry>> {
        self.entries().get(&id).cloned()
    }

    /// The entry of `handle`'s session, made if there is none; `true` with
    /// it when it is new (its end must be watched).
    pub fn adopt(&self, handle: SessionHandle) -> (Arc<Entry>, bool) {
        let mut entries = self.entries();
        if let Some(entry) = entries.get(&handle.id()) {
            return (entry.clone(), false);
        }
        let entry = Arc::new(Entry::new(handle, self.held.clone()));
        if let Some(parent) = entry.handle.parent().and_then(|p| entries.get(&p)) {
            let mut watchers = parent.watchers();
            watchers.children.retain(|c| !c.is_cancelled());
            watchers.children.push(entry.told.clone());
        }
        entries.insert(entry.handle.id(), entry.clone());
        (entry, true)
    }

    /// Forgets `entry` (its session is finalized).
    pub fn remove(&self, entry: &Arc<Entry>) {
        let mut entries = self.entries();
        if entries
            .get(&entry.handle.id())
            .is_some_and(|e| Arc::ptr_eq(e, entry))
        {
            entries.remove(&entry.handle.id());
        }
    }

    /// How many sessions the gateway serves now.
    pub fn len(&self) -> usize {
        self.entries().len()
    }
}
