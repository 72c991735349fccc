//! What a session's handles share with the kernel: its identity, its end
//! once the finalize plan has run, and its own stream of lifecycle events.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use settle_core::{EndReason, SessionId};
use tokio::sync::{broadcast, Notify};

use crate::event::LifecycleEvent;
use crate::sent::Sent;

/// How many events a session's subscribers may fall behind before they miss some.
const SESSION_EVENTS: usize = 256;

/// How a session's finalize plan ended here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// Its row was ended, with this reason.
    Finalized(EndReason),
    /// The store did not commit the end of its row: the session is done
    /// here, and its row is left live for recovery or a peer (G8).
    Unwritten,
}

#[derive(Debug)]
pub(crate) struct SessionShared {
    pub id: SessionId,
    pub name: Arc<str>,
    pub parent: Option<SessionId>,
    /// The session this one continues (`settle chat --resume`), if any.
    pub resumed_from: Option<SessionId>,
    /// The `session{id,name,parent}` span every work, write and hook of the
    /// session runs in (a no-op without a subscriber).
    pub span: tracing::Span,
    /// Set once the finalize plan has run: after the commit of its row, or
    /// once the store could not commit it.
    finalized: OnceLock<End>,
    /// Wakes whoever waits for `finalized`.
    finalized_waiters: Notify,
    /// The session's own events, created by its first subscriber.
    events: OnceLock<broadcast::Sender<LifecycleEvent>>,
    /// What the store holds of its conversation, once it has run a turn
    /// here: the driver sets it at a turn's start, the turn's work adds the
    /// reply as it is persisted.
    sent: Mutex<Option<Box<Sent>>>,
}

impl SessionShared {
    pub fn new(
        id: SessionId,
        name: Arc<str>,
        parent: Option<SessionId>,
        resumed_from: Option<SessionId>,
        parent_span: Option<&tracing::Span>,
    ) -> Arc<Self> {
        #[cfg(not(feature = "otel-genai"))]
        let span = {
            let _ = parent_span;
            tracing::info_span!(
                parent: None,
                "session",
                id = id.0,
                name = %name,
                parent = parent.map(|p| p.0),
            )
        };
        // GenAI conventions: an agent's session nests under its parent's.
        #[cfg(feature = "otel-genai")]
        let span = tracing::info_span!(
            parent: parent_span.and_then(tracing::Span::id),
            "session",
            id = id.0,
            name = %name,
            parent = parent.map(|p| p.0),
            gen_ai.agent.name = %name,
            gen_ai.conversation.id = %id.0,
        );
        Arc::new(SessionShared {
            id,
            name,
            parent,
            resumed_from,
            span,
            finalized: OnceLock::new(),
            finalized_waiters: Notify::new(),
            events: OnceLock::new(),
            sent: Mutex::new(None),
        })
    }

    /// A session that was finalized already, as the store has it: its
    /// handles are closed from the start.
    pub fn closed(row: &settle_store::SessionRow, reason: EndReason) -> Arc<Self> {
        let shared = Self::new(
            row.id,
            row.name.as_str().into(),
            row.parent,
            row.resumed_from,
            None,
        );
        shared.set_finalized(reason);
        shared
    }

    /// What the store holds of the session's conversation (see
    /// [`sent`](crate::sent)).
    pub fn sent(&self) -> MutexGuard<'_, Option<Box<Sent>>> {
        self.sent.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How the finalize plan ended, once it has run.
    pub fn end(&self) -> Option<End> {
        self.finalized.get().copied()
    }

    /// Records that the row was ended (once) and wakes every waiter.
    pub fn set_finalized(&self, reason: EndReason) {
        self.set_end(End::Finalized(reason));
    }

    /// Records (once) that the store did not commit the end of the row,
    /// and wakes every waiter.
    pub fn set_unwritten(&self) {
        self.set_end(End::Unwritten);
    }

    fn set_end(&self, end: End) {
        if self.finalized.set(end).is_ok() {
            self.finalized_waiters.notify_waiters();
        }
    }

    /// Waits for the end of the finalize plan.
    pub async fn finalized(&self) -> End {
        loop {
            let notified = self.finalized_waiters.notified();
            if let Some(end) = self.end() {
                return end;
            }
            notified.await;
        }
    }

    /// A receiver of this session's events from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<LifecycleEvent> {
        self.events
            .get_or_init(|| broadcast::channel(SESSION_EVENTS).0)
            .subscribe()
    }

    /// Whether anyone listens to this session's events.
    pub fn is_watched(&self) -> bool {
        self.events.get().is_some_and(|tx| tx.receiver_count() > 0)
    }

    /// Sends `event` to this session's subscribers, if it has any.
    pub fn publish(&self, event: &LifecycleEvent) {
        if let Some(tx) = self.events.get() {
            if tx.receiver_count() > 0 {
                let _ = tx.send(event.clone());
            }
        }
    }
}
