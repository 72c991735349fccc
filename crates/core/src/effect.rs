use std::fmt;
use std::time::Instant;

use crate::{CancelMode, EndReason, Outcome, SessionId, State};

/// The identity of one work: the turn `turn` of `session`. A work is never
/// cancelled twice (G6), and detach applies only to the work it names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkId {
    /// The session.
    pub session: SessionId,
    /// The turn number, from 1.
    pub turn: u32,
}

/// An output of the core: something the driver must do, or record.
///
/// Drain them with [`Core::poll_effect`](crate::Core::poll_effect) after every
/// input, in order: the order carries the guarantees (descendants are
/// cancelled before their ancestors, children finalized before parents).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Ask a work to stop. Emitted at most once per work (G6).
    CancelWork {
        /// The work.
        work: WorkId,
        /// Graceful: let the turn finish; immediate: stop now.
        mode: CancelMode,
    },
    /// Close the work's provider stream. Emitted at most once per work, when
    /// the work itself may not: a cancel that landed before the stream
    /// attached, an immediate cancel, a detach (G4).
    CloseStream {
        /// The work whose stream to close.
        work: WorkId,
    },
    /// The work ignored cancellation past the settle deadline: abandon it and
    /// revoke its write access to the session (G5).
    DetachWork {
        /// The work to abandon.
        work: WorkId,
    },
    /// Persist everything buffered for this session's transcript now (G9).
    FlushTranscript {
        /// The session.
        session: SessionId,
    },
    /// Run the finalize plan for this session. Emitted exactly once per
    /// session (G2), after all its descendants (G1), never while its work can
    /// still write (G9).
    Finalize(Finalize),
    /// A state transition to record on the session's timeline.
    Transition(Transition),
    /// Shutdown has begun and every session is finalized: the driver may exit.
    ShutdownComplete,
}

/// The finalize plan for one session (SPEC §4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalize {
    /// The session.
    pub session: SessionId,
    /// Why it ends.
    pub reason: EndReason,
    /// The outcome of its last turn, if it ran any.
    pub last_outcome: Option<Outcome>,
    /// Whether memory may be committed: only when the last turn completed (G7).
    pub commit_memory: bool,
}

impl Finalize {
    /// The steps, in the order they must run; each is best-effort.
    pub const PLAN: [FinalizeStep; 6] = FinalizeStep::ALL;

    /// The `completed` flag of the `on_session_end` hook.
    pub fn completed(&self) -> bool {
        self.last_outcome.is_some_and(Outcome::is_complete)
    }

    /// The `interrupted` flag of the `on_session_end` hook: its last turn was
    /// cut short from outside.
    pub fn interrupted(&self) -> bool {
        self.last_outcome.is_some_and(Outcome::is_interrupted)
    }
}

/// One step of the finalize plan.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinalizeStep {
    /// Persist the transcript snapshot.
    PersistTranscript,
    /// Commit memory (only when [`Finalize::commit_memory`]).
    CommitMemory,
    /// End the durable row with the end reason (the latch, G2).
    EndRow,
    /// Fire the `on_session_end` hook.
    EndHook,
    /// Release the active-session slot.
    ReleaseSlot,
    /// Interrupt outstanding delegations.
    InterruptDelegations,
}

impl FinalizeStep {
    /// Every step, in plan order.
    pub const ALL: [FinalizeStep; 6] = [
        FinalizeStep::PersistTranscript,
        FinalizeStep::CommitMemory,
        FinalizeStep::EndRow,
        FinalizeStep::EndHook,
        FinalizeStep::ReleaseSlot,
        FinalizeStep::InterruptDelegations,
    ];
}

/// A timeline record: one state transition with its time and cause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transition {
    /// The session.
    pub session: SessionId,
    /// When, as given by the driver.
    pub at: Instant,
    /// The state before (`None` on registration).
    pub from: Option<State>,
    /// The state after.
    pub to: State,
    /// Why.
    pub cause: Cause,
}

/// Why a transition happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The session was registered.
    Registered,
    /// A turn started.
    TurnStarted,
    /// The turn's work ended with this outcome.
    TurnEnded(Outcome),
    /// The agent reported itself finished.
    AgentFinished,
    /// A cancel was requested for this session.
    CancelRequested(CancelMode),
    /// A user closed the session.
    UserClose,
    /// An ancestor was cancelled, finished or closed.
    AncestorWindingDown,
    /// Every descendant settled, and the session has no work of its own.
    DescendantsSettled,
    /// The settle deadline passed; the work was detached (G5).
    SettleDeadline,
    /// The drain period of a shutdown ended with the turn still running.
    DrainEnded,
    /// The finalize plan ran with this end reason.
    Finalized(EndReason),
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Registered => f.write_str("registered"),
            Cause::TurnStarted => f.write_str("turn started"),
            Cause::TurnEnded(outcome) => write!(f, "turn ended: {outcome}"),
            Cause::AgentFinished => f.write_str("agent finished"),
            Cause::CancelRequested(mode) => write!(f, "cancel requested ({mode})"),
            Cause::UserClose => f.write_str("closed by user"),
            Cause::AncestorWindingDown => f.write_str("ancestor winding down"),
            Cause::DescendantsSettled => f.write_str("descendants settled"),
            Cause::SettleDeadline => f.write_str("settle deadline passed: work detached"),
            Cause::DrainEnded => f.write_str("drain ended: cancelled"),
            Cause::Finalized(reason) => write!(f, "finalized: {reason}"),
        }
    }
}
