//! A read-only view of one kept session, for drivers and tests.

use std::time::Instant;

use crate::session::Session;
use crate::sessions::Sessions;
use crate::{Budget, CancelMode, EndReason, Outcome, Scope, SessionId, State, WorkId};

/// A read-only view of one session, for drivers and tests.
#[derive(Debug, Clone, Copy)]
pub struct SessionView<'a> {
    pub(crate) id: SessionId,
    pub(crate) inner: &'a Session,
    pub(crate) sessions: &'a Sessions,
}

impl<'a> SessionView<'a> {
    /// Its id.
    pub fn id(&self) -> SessionId {
        self.id
    }
    /// Its lifecycle state.
    pub fn state(&self) -> State {
        self.inner.state
    }
    /// The session that spawned it.
    pub fn parent(&self) -> Option<SessionId> {
        self.inner.parent
    }
    /// Whose it is, for the LRU cap (see [`Scope`]).
    pub fn scope(&self) -> Scope {
        self.inner.scope
    }
    /// The sessions it spawned and the core still knows (not forgotten).
    pub fn children(&self) -> impl Iterator<Item = SessionId> + 'a {
        let sessions = self.sessions;
        self.inner
            .children
            .iter()
            .copied()
            .filter(move |c| sessions.contains_key(c))
    }
    /// How many turns it has started.
    pub fn turns(&self) -> u32 {
        self.inner.turns
    }
    /// The work of the turn in flight, if any.
    pub fn work(&self) -> Option<WorkId> {
        self.inner.works.turn.map(|w| w.id(self.id))
    }
    /// Every work in flight: the turn first, then the tasks.
    pub fn works(&self) -> impl Iterator<Item = WorkId> + 'a {
        let id = self.id;
        self.inner.works.iter().map(move |w| w.id(id))
    }
    /// The cancel the turn in flight was sent, if any.
    pub fn work_cancel(&self) -> Option<CancelMode> {
        self.inner.works.turn.and_then(|w| w.cancel)
    }
    /// The outcome of its last turn (or of its work, if detached).
    pub fn last_outcome(&self) -> Option<Outcome> {
        self.inner.last_outcome
    }
    /// Why it is closing, once a close was decided: the end reason it would
    /// be finalized with now (a shutdown finalizes everything `shutdown`).
    pub fn closing(&self) -> Option<EndReason> {
        self.inner
            .intent
            .map(|intent| intent.reason(self.inner.last_outcome))
    }
    /// Whether it holds on pending input or an active delegation.
    pub fn is_held(&self) -> bool {
        !self.inner.holds.is_empty()
    }
    /// How many transports are attached.
    pub fn transports(&self) -> u16 {
        self.inner.transport.attached
    }
    /// When it last became idle.
    pub fn idle_since(&self) -> Instant {
        self.inner.idle_since
    }
    /// The earliest pending settle deadline of its works, if any is being cancelled.
    pub fn settle_deadline(&self) -> Option<Instant> {
        self.inner.works.iter().filter_map(|w| w.settle_at).min()
    }

    /// Its own budget, what its subtree spent of it (turns, tokens), and
    /// whether it ran out; `None` without a budget of its own.
    pub fn budget(&self) -> Option<(Budget, u32, u64, bool)> {
        self.inner
            .budget
            .as_ref()
            .map(|b| (b.limits, b.turns, b.tokens, b.exhausted))
    }

    /// Whether a budget (its own or an ancestor's) counts what it spends.
    pub fn is_budgeted(&self) -> bool {
        self.inner.budgeted
    }
}
