use std::time::SystemTime;

use settle_core::{EndReason, Outcome, SessionId, State};

/// What happened in the runtime, for progress displays and logs.
///
/// Subscribe with [`Runtime::subscribe`](crate::Runtime::subscribe). A
/// subscriber that falls far behind misses events (it is told how many); the
/// durable record in the store is always complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LifecycleEvent {
    /// A session was registered.
    Registered {
        /// The new session.
        session: SessionId,
        /// Its name.
        name: String,
        /// Its parent.
        parent: Option<SessionId>,
        /// When.
        at: SystemTime,
    },
    /// A session changed state.
    Transition {
        /// The session.
        session: SessionId,
        /// From (`None` on registration).
        from: Option<State>,
        /// To.
        to: State,
        /// Why, in words.
        cause: String,
        /// When.
        at: SystemTime,
    },
    /// A chunk was persisted (acknowledged by the store, G7).
    Chunk {
        /// The session.
        session: SessionId,
        /// The turn, from 1.
        turn: u32,
        /// The chunk's position in the turn, from 0.
        seq: u32,
        /// Its text.
        text: String,
    },
    /// A turn's work ended.
    TurnEnded {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: u32,
        /// How.
        outcome: Outcome,
    },
    /// A work ignored cancellation past its settle deadline and was detached.
    Detached {
        /// The session.
        session: SessionId,
        /// The turn.
        turn: u32,
    },
    /// A session's finalize plan ran.
    Finalized {
        /// The session.
        session: SessionId,
        /// Why it ended.
        reason: EndReason,
        /// Whether memory was committed.
        memory_committed: bool,
    },
    /// A store write failed; the runtime carried on (G7 still holds for
    /// everything acknowledged).
    StoreFailed {
        /// The session, if the write was for one.
        session: Option<SessionId>,
        /// What failed.
        message: String,
    },
}
