use crate::{EndReason, SessionId, State};

/// Why the core refused an input. Nothing changed when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The session has been finalized; its handle is closed (G10).
    #[error("session {0} is finalized; its handle is closed")]
    SessionClosed(SessionId),
}

/// What an accepted input did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use = "a no-op can mean the request was already satisfied"]
pub enum Handled {
    /// The input changed the state; effects may be waiting.
    Applied,
    /// The session was already finalized; the request is a no-op (G2).
    AlreadyFinalized,
    /// The request was already satisfied or does not apply (a second cancel,
    /// a release without a hold, a report for a work that is gone); nothing changed.
    NoOp,
}
