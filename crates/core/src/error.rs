use crate::{EndReason, SessionId, State, WorkId};

/// Why the core refused an input. Nothing changed when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The id was never registered (or was forgotten after finalize).
    #[error("session {0} is not known; register it before sending events for it")]
    UnknownSession(SessionId),
    /// The id is taken.
    #[error("session {0} is already registered; pick a new id")]
    DuplicateSession(SessionId),
    /// The event does not apply to the session's current state.
    #[error("session {session} is {state}: cannot {action}")]
    WrongState {
        /// The session.
        session: SessionId,
        /// Its state.
        state: State,
        /// What was attempted, as a verb phrase.
        action: &'static str,
    },
    /// Shutdown has begun; nothing new starts.
    #[error("shutting down: no new session or turn may start")]
    ShuttingDown,
    /// The session was claimed or is being closed.
    #[error("session {session} is closing ({reason}): it admits no new turn")]
    Closing {
        /// The session.
        session: SessionId,
        /// Why it is closing.
        reason: EndReason,
    },
    /// The requested parent cannot take children.
    #[error("parent session {parent} is {state}{closing}: children can only be registered under a registered or running parent that is not closing", closing = if *.closing { " and closing" } else { "" })]
    ParentNotLive {
        /// The parent.
        parent: SessionId,
        /// Its state.
        state: State,
        /// Whether it is closing (winding down).
        closing: bool,
    },
    /// The session's budget (or an ancestor's, `session`) has no turn left:
    /// the turn was refused, and the budget's subtree is winding down
    /// (`budget_exhausted`).
    #[error(
        "the budget of session {session} has no {limit} left; its subtree is being wound down"
    )]
    BudgetExhausted {
        /// The session whose budget ran out.
        session: SessionId,
        /// Which limit.
        limit: crate::BudgetLimit,
    },
    /// Every active-session slot is taken (see [`Policy::slots`](crate::Policy::slots)).
    #[error("all {slots} active-session slots are taken; wait for a session to be finalized or configure more slots")]
    NoSlot {
        /// How many slots there are.
        slots: usize,
    },
    /// The LRU cap (see [`Policy::lru_cap`](crate::Policy::lru_cap)) is
    /// reached and no session can be evicted for a new one: every open
    /// session of its [`Scope`](crate::Scope) is running, held, has
    /// children, or is the parent asked for (sessions of other scopes are
    /// never evicted for it). Nothing was registered and nothing evicted.
    #[error("all {cap} places of the session cap are taken and none of this scope's sessions can be evicted (they are running, held or have children; other scopes' are not evicted for it); close or release one, or raise the cap")]
    OverCapacity {
        /// The cap.
        cap: usize,
    },
    /// An [`Adopt`](crate::Event::Adopt) at the LRU cap: an adoption
    /// evicts no session of this core (G12: a rolling restart that moves
    /// sessions onto a full process must not end that process's own, which
    /// clients may be using). Nothing was adopted and nothing evicted; the
    /// session stays released for another process, or for later.
    #[error("all {cap} places of the session cap are taken, and an adoption evicts no session: attach it on another process of the fleet, or once a place is free here")]
    NoRoomToAdopt {
        /// The cap.
        cap: usize,
    },
    /// The session's previous turn was cancelled (or its `Turn` dropped), or
    /// its start refused to its caller, and it has not ended yet: its work
    /// is still unwinding, for at most the settle timeout (G5).
    #[error("session {session}: turn {turn} was cancelled (or its start refused) and is still settling; await its outcome (`Turn::outcome`) before starting the next turn")]
    TurnSettling {
        /// The session.
        session: SessionId,
        /// The turn still settling.
        turn: u32,
    },
    /// The session has been finalized; its handle is closed (G10).
    #[error("session {0} is finalized; its handle is closed")]
    SessionClosed(SessionId),
    /// The session was handed off to another process (SPEC §12): use it
    /// where it is adopted.
    #[error("session {0} was handed off to another process; attach to it there")]
    HandedOff(SessionId),
}

impl Error {
    /// Whether it was refused because a shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        matches!(self, Error::ShuttingDown)
    }

    /// Whether the session is finalized (G10).
    pub fn is_session_closed(&self) -> bool {
        matches!(self, Error::SessionClosed(_))
    }

    /// Whether the session is closing: it admits no new work.
    pub fn is_closing(&self) -> bool {
        matches!(self, Error::Closing { .. })
    }

    /// Whether a budget over the session has nothing left.
    pub fn is_budget_exhausted(&self) -> bool {
        matches!(self, Error::BudgetExhausted { .. })
    }
}

/// What an accepted input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// The input changed the state; effects may be waiting.
    Applied,
    /// A work was admitted (the answer to `StartTurn` and `StartTask`): start
    /// it under this id now (quinn's `streams().open()`). No effect orders
    /// it; the effects the same input queued (its transition) go first.
    Started(WorkId),
    /// The session was registered at the LRU cap (the answer to
    /// `Register` there): the least recently active idle sessions of its
    /// scope that make room for it are evicted once its registration is
    /// durable, when the driver says so with
    /// [`Event::Committed`](crate::Event::Committed). Until then it counts
    /// against the cap; a registration withdrawn instead
    /// ([`Event::Withdraw`](crate::Event::Withdraw)) evicts no one.
    EvictsOnCommit,
    /// The session was already finalized; the request is a no-op (G2).
    AlreadyFinalized,
    /// The request was already satisfied or does not apply (a second cancel,
    /// a release without a hold, a report for a work that is gone); nothing changed.
    NoOp,
}

impl Handled {
    /// The work a start admitted, if this answers one.
    pub fn started(self) -> Option<WorkId> {
        match self {
            Handled::Started(work) => Some(work),
            _ => None,
        }
    }
}
