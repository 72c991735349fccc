use std::time::Duration;

use crate::{CancelMode, Outcome, SessionId};

/// An input to the core: something that happened, or something asked of it.
///
/// Feed each with [`Core::handle`](crate::Core::handle), then drain
/// [`Core::poll_effect`](crate::Core::poll_effect) before the next input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new session, optionally under a parent that is registered or running
    /// and not closing. Refused while shutting down.
    Register {
        /// The caller-chosen identity (usually the store's row id).
        session: SessionId,
        /// The session that spawned this one.
        parent: Option<SessionId>,
    },
    /// A turn's work starts. Refused while shutting down or while the session is closing.
    StartTurn {
        /// The session whose turn starts.
        session: SessionId,
    },
    /// The current turn's provider stream is attached to its work. If a cancel
    /// has already landed, the core asks for the stream to be closed (G4).
    StreamAttached {
        /// The session whose stream attached.
        session: SessionId,
    },
    /// The current turn's provider stream reported itself closed.
    StreamClosed {
        /// The session whose stream closed.
        session: SessionId,
    },
    /// The current turn's work ended on its own terms (completed, failed, idle
    /// timeout, cancelled itself). The session stays open for another turn
    /// unless it is being cancelled.
    TurnEnded {
        /// The session whose turn ended.
        session: SessionId,
        /// How it ended.
        outcome: Outcome,
    },
    /// The current turn's work exited without reporting an outcome of its own:
    /// `cancelled` if it was asked to stop, `failed` otherwise.
    WorkExited {
        /// The session whose work exited.
        session: SessionId,
    },
    /// The agent is done. Its live descendants are cancelled first; it settles
    /// and is finalized after all of them (G1).
    AgentFinished {
        /// The finishing session.
        session: SessionId,
    },
    /// Cancel the session: its descendants first, then its own work. The
    /// session settles when its work has exited (or was detached, G5).
    Cancel {
        /// The session to cancel.
        session: SessionId,
        /// Graceful (finish the current turn) or immediate (close the stream now).
        mode: CancelMode,
    },
    /// Cancel only the turn in flight (a user pressing Ctrl-C in a chat): the
    /// session stays open for the next turn.
    CancelTurn {
        /// The session whose turn to cancel.
        session: SessionId,
    },
    /// Cancel every live descendant, never the session itself.
    CancelDescendants {
        /// The session whose subtree to cancel.
        session: SessionId,
    },
    /// Close the session on a user's request: cancel first, finalize once settled.
    UserClose {
        /// The session to close.
        session: SessionId,
    },
    /// The session waits on something that no automatic reclaim may cut short.
    Hold {
        /// The held session.
        session: SessionId,
        /// What it waits on.
        hold: Hold,
    },
    /// A hold ended.
    Release {
        /// The held session.
        session: SessionId,
        /// What it waited on.
        hold: Hold,
    },
    /// A transport (a socket, a window) attached to the session.
    TransportAttached {
        /// The session.
        session: SessionId,
        /// Close the session as soon as its last transport drops.
        close_on_disconnect: bool,
    },
    /// A transport detached from the session.
    TransportDetached {
        /// The session.
        session: SessionId,
    },
    /// Run one automatic reclaim path now instead of waiting for its deadline.
    Sweep(Sweep),
    /// Start the graceful shutdown (G9): no new session or turn, transcripts
    /// flushed, idle sessions finalized, running turns drained until `now + drain`.
    BeginShutdown {
        /// How long running turns may still finish.
        drain: Duration,
    },
    /// End the drain now (a second shutdown signal).
    SkipDrain,
}

/// What a held session waits on (SPEC §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Hold {
    /// Input it asked a person for.
    PendingInput,
    /// A delegation to another session that is still outstanding.
    Delegation,
}

/// The automatic reclaim paths that can be run on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sweep {
    /// Claim every session idle for at least the idle TTL.
    Idle,
    /// Evict least recently active sessions while over the cap.
    Lru,
    /// Claim every session whose transport has been gone for the orphan grace.
    Orphan,
}
