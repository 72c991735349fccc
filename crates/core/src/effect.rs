use std::fmt;
use std::time::Instant;

use crate::{BudgetLimit, CancelMode, EndReason, Holds, Outcome, SessionId, State, WorkId};

/// An output of the core: an order for the driver, to execute as it says.
///
/// Drain them with [`Core::poll_effect`](crate::Core::poll_effect) after every
/// input, in order: the order carries the guarantees (descendants are
/// cancelled before their ancestors, a turn's end is recorded before its
/// session's finalize, children are finalized before parents). Every effect
/// names what it is about and carries everything needed to execute it: a
/// driver never looks at the core's state to learn what an effect means.
///
/// A work is started by the answer to the input that admitted it
/// ([`Handled::Started`](crate::Handled::Started)), not by an effect.
///
/// There is no session-wide cancellation token: a session's cancel is one
/// [`CancelWork`](Self::CancelWork) per live work of the session (and of each
/// cancelled descendant).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Ask a work to stop. Emitted at most once per work (G6).
    /// `Immediate`: cancel the work's own token now; the work closes its
    /// stream as it unwinds (it gets its bounded chance, G5). `Graceful`: let
    /// the current turn finish; nothing to do now, the settle deadline bounds it.
    CancelWork {
        /// The work.
        work: WorkId,
        /// Graceful: let the turn finish; immediate: stop now.
        mode: CancelMode,
    },
    /// Ask each of these works to stop, in this order: a subtree's cancel
    /// (a finishing agent's, a cancelled session's descendants), as one
    /// order, descendants first. The same as one
    /// [`CancelWork`](Self::CancelWork) for each, all in `mode`: each work
    /// is in at most one cancel (G6).
    CancelWorks {
        /// The works, descendants first.
        works: Vec<WorkId>,
        /// Graceful: let the turn finish; immediate: stop now.
        mode: CancelMode,
    },
    /// Close the work's provider stream now, from outside, whatever the work
    /// is doing (G4). Emitted at most once per work, where the work itself may
    /// not close it: when a stream attaches after an immediate cancel (the
    /// attach race of seed 001), and right before a detach.
    CloseStream {
        /// The work whose stream to close.
        work: WorkId,
    },
    /// The work ignored cancellation past the settle deadline: abandon it and
    /// revoke its write access to the session first (G5). A
    /// [`EndWork`](Self::EndWork) with outcome `detached` follows.
    DetachWork {
        /// The work to abandon.
        work: WorkId,
    },
    /// A work is over, with the outcome the core settled on: record a turn's
    /// end, answer whoever waits for it. Emitted exactly once per work, before
    /// any transition or finalize the end causes.
    EndWork {
        /// The work.
        work: WorkId,
        /// How it ended (for a report without one, `cancelled` if it was asked
        /// to stop, else `failed`; `detached` after a detach).
        outcome: Outcome,
    },
    /// Persist everything buffered for every transcript now (G9). Emitted once,
    /// when a shutdown begins, before any finalize of the shutdown.
    FlushTranscripts,
    /// Run the finalize plan for this session. Emitted exactly once per
    /// session (G2), after all its descendants' (G1), never while a work of
    /// it can still write (G9).
    Finalize(Finalize),
    /// A state transition to record on the session's timeline.
    Transition(Transition),
    /// The transitions of many sessions at one moment for one cause (a
    /// subtree's cancel), to record on each one's timeline: the same as one
    /// [`Transition`](Self::Transition) for each, in order.
    Transitions(Box<Transitions>),
    /// Release this session for another process to adopt (SPEC §12): in a
    /// handoff ([`Event::BeginHandoff`](crate::Event::BeginHandoff)) it is
    /// open and idle, no work of it can write any more and its children
    /// were released or finalized first. The driver writes it released in
    /// the store (no owner, `registered`, timeline cause [`Cause::HandedOff`])
    /// and lets go of it: the core has forgotten it, and answers every
    /// input about it [`Error::HandedOff`](crate::Error::HandedOff).
    /// Emitted at most once per session, never for a finalized one.
    HandOff(HandOff),
    /// Record `session`'s holds where a process that adopts it finds them
    /// (SPEC §5: a held session is reclaimable by no automatic path, in
    /// this process or in the one that adopts it after this one crashed).
    /// Emitted each time a hold is taken or given back, with the counts
    /// after it, and with none just before the transition to `finalized`
    /// of a session finalized while held (it has no adopter); the driver
    /// keeps them in order, and a store that cannot keep them loses only
    /// what a crash would take.
    RecordHolds {
        /// The session.
        session: SessionId,
        /// Its holds now.
        holds: Holds,
    },
    /// Shutdown has begun and every session is finalized or handed off: the
    /// driver may exit. Says what the shutdown did.
    ShutdownComplete(Box<ShutdownSummary>),
}

impl Effect {
    /// The effect as single orders: each member of a set effect
    /// ([`CancelWorks`](Self::CancelWorks), [`Transitions`](Self::Transitions))
    /// in order, any other effect as itself. For a driver, or a test, that
    /// executes one order at a time; a driver that executes a set as a set
    /// does the same, cheaper.
    pub fn singles(self) -> Vec<Effect> {
        match self {
            Effect::CancelWorks { works, mode } => works
                .into_iter()
                .map(|work| Effect::CancelWork { work, mode })
                .collect(),
            Effect::Transitions(set) => set.iter().map(Effect::Transition).collect(),
            other => vec![other],
        }
    }
}

/// The transitions of many sessions at one moment for one cause
/// ([`Effect::Transitions`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transitions {
    /// When, as given by the driver.
    pub at: Instant,
    /// Why.
    pub cause: Cause,
    /// Each session's move, in order.
    pub moves: Vec<Move>,
}

/// One session's move in [`Transitions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    /// The session.
    pub session: SessionId,
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
}

impl Transitions {
    /// Each move as its [`Transition`], in order.
    pub fn iter(&self) -> impl Iterator<Item = Transition> + '_ {
        self.moves.iter().map(|m| Transition {
            session: m.session,
            at: self.at,
            from: Some(m.from),
            to: m.to,
            cause: self.cause,
        })
    }
}

/// What a shutdown did to the works it found (G9), as decided by the core.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownSummary {
    /// Sessions whose turn was running when shutdown began and ended on its
    /// own within the drain.
    pub drained: Vec<SessionId>,
    /// Sessions whose turn was still running when the drain ended, and was
    /// cancelled immediately.
    pub cancelled: Vec<SessionId>,
    /// Works detached (write access revoked) after shutdown began.
    pub detached: Vec<WorkId>,
    /// The shutdown was forced by the loss of this process's lease (G8):
    /// what it finalizes may already belong to another process's recovery.
    pub lease_lost: bool,
    /// The shutdown hands sessions off (SPEC §12) instead of finalizing them.
    pub handoff: bool,
    /// Sessions released for another process to adopt, in the order they were.
    pub released: Vec<SessionId>,
}

/// A session released for adoption by another process (SPEC §12).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HandOff {
    /// The session.
    pub session: SessionId,
    /// Turns it ran (the adopter's next turn is `turns + 1`).
    pub turns: u32,
    /// How its last turn ended, if it ran any.
    pub last_outcome: Option<Outcome>,
    /// Its holds (SPEC §5), for the adopter to keep.
    pub holds: Holds,
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
    /// What its record says it ended with (SPEC §7: of the last turn or of
    /// the work): its last turn's outcome, or, when it ran no turn, its
    /// last task's. Memory and the end hook follow `last_outcome` only.
    pub outcome: Option<Outcome>,
    /// Whether memory may be committed: only when the last turn completed (G7).
    pub commit_memory: bool,
    /// Whether a shutdown had begun when it was ordered (it is then part of
    /// what the shutdown reports).
    pub in_shutdown: bool,
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

impl Transition {
    /// Whether to record it as a step of the session's timeline. The
    /// registration and the finalize are not: the session's row records the
    /// first, and the finalize's latch records the last with the plan.
    /// (Decided from the transition itself rather than carried beside it, so
    /// an effect stays as small as it was: the core's throughput row moves
    /// every effect through a queue.)
    pub fn timeline(&self) -> bool {
        self.from.is_some() && self.to != State::Finalized
    }
}

/// Why a transition happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Cause {
    /// The session was registered.
    Registered,
    /// A turn started.
    TurnStarted,
    /// A task started.
    TaskStarted,
    /// The turn's work ended with this outcome.
    TurnEnded(Outcome),
    /// A task ended with this outcome.
    TaskEnded(Outcome),
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
    /// The session it delegated to was finalized: the delegation was
    /// interrupted (SPEC §4 step 6).
    DelegationInterrupted,
    /// The finalize plan ran with this end reason.
    Finalized(EndReason),
    /// Its budget (or an ancestor's) ran out of this limit.
    BudgetExhausted(BudgetLimit),
    /// The session was released for another process to adopt (SPEC §12).
    HandedOff,
    /// The session was adopted from the process that released it (SPEC §12).
    Adopted,
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Registered => f.write_str("registered"),
            Cause::TurnStarted => f.write_str("turn started"),
            Cause::TaskStarted => f.write_str("task started"),
            Cause::TurnEnded(outcome) => write!(f, "turn ended: {outcome}"),
            Cause::TaskEnded(outcome) => write!(f, "task ended: {outcome}"),
            Cause::AgentFinished => f.write_str("agent finished"),
            Cause::CancelRequested(mode) => write!(f, "cancel requested ({mode})"),
            Cause::UserClose => f.write_str("closed by user"),
            Cause::AncestorWindingDown => f.write_str("ancestor winding down"),
            Cause::DescendantsSettled => f.write_str("descendants settled"),
            Cause::SettleDeadline => f.write_str("settle deadline passed: work detached"),
            Cause::DrainEnded => f.write_str("drain ended: cancelled"),
            Cause::DelegationInterrupted => f.write_str("delegation interrupted"),
            Cause::Finalized(reason) => write!(f, "finalized: {reason}"),
            Cause::BudgetExhausted(limit) => write!(f, "budget exhausted: {limit}"),
            Cause::HandedOff => f.write_str("handoff"),
            Cause::Adopted => f.write_str("adopted"),
        }
    }
}
