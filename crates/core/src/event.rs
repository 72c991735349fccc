use std::time::Duration;

use crate::{Adoptee, Budget, CancelMode, Outcome, Scope, SessionId, WorkId};

/// An input to the core: something that happened, or something asked of it.
///
/// Feed each with [`Core::handle`](crate::Core::handle), then drain
/// [`Core::poll_effect`](crate::Core::poll_effect) before the next input.
///
/// # The answer table
///
/// Every input that names a session is first looked up in one table, coded
/// once in the core and applied before the input is dispatched: what a
/// finalized session gets does not depend on the path that finalized it, nor
/// on whether the core still keeps its record or has
/// [forgotten](crate::Core::forget) it (the core remembers every id it
/// finalized, compactly, so a handle never hears "not known" after its
/// finalize was ordered).
///
/// | input | finalized (or forgotten) | closing or winding down |
/// |---|---|---|
/// | a request to end it: `AgentFinished`, `Abandoned`, `Cancel`, `CancelTurn`, `CancelWork`, `CancelDescendants`, `UserClose` | `Ok(Handled::AlreadyFinalized)` (G2: a no-op that says so) | handled (a second cancel is a `NoOp`, G6) |
/// | letting go of it: `Release`, `TransportDetached`, `Withdraw` | `Ok(Handled::AlreadyFinalized)` | handled |
/// | starting work: `StartTurn`, `StartTask` | `Err(Error::SessionClosed)` (G10) | `Err(Error::ShuttingDown)`, `Err(Error::Closing)` or `Err(Error::WrongState)` |
/// | a child under it: `Register` | `Err(Error::SessionClosed)` | `Err(Error::ShuttingDown)` or `Err(Error::ParentNotLive)` |
/// | using it: `Hold`, `TransportAttached`, `Delegate` (either side), `SetBudget` | `Err(Error::SessionClosed)` (G10) | handled |
/// | a work's report: `StreamAttached`, `StreamClosed`, `WorkEnded`, `WorkExited`, `Usage`; a registration's commit: `Committed` | `Ok(Handled::NoOp)` (the work is gone) | handled |
///
/// A session this core handed off ([`Effect::HandOff`](crate::Effect::HandOff))
/// is another process's to use: every input naming it but a work's report
/// (a `NoOp`), [`Event::Adopt`] and [`Event::AdoptTree`] is refused with
/// [`Error::HandedOff`](crate::Error::HandedOff).
///
/// An id the core was never given is refused with
/// [`Error::UnknownSession`](crate::Error::UnknownSession) by every input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A new session, optionally under a parent that is registered or running
    /// and not closing. Refused while shutting down. At the LRU cap it is
    /// admitted only when enough idle sessions of its [`Scope`] could be
    /// evicted to make room (never the new one, its parent, nor a session
    /// of another scope); with too few it is refused with
    /// [`Error::OverCapacity`](crate::Error::OverCapacity), changing
    /// nothing. Admitted there, the answer is
    /// [`Handled::EvictsOnCommit`](crate::Handled::EvictsOnCommit): the
    /// evictions wait for [`Committed`](Self::Committed), so a
    /// registration the store refuses and the driver
    /// [withdraws](Self::Withdraw) evicts no one.
    Register {
        /// The caller-chosen identity (usually the store's row id).
        session: SessionId,
        /// The session that spawned this one.
        parent: Option<SessionId>,
        /// Whose it is, for the LRU cap; `None`: its parent's, and
        /// [`Scope::SHARED`] for a root (a program with one tenant never
        /// names one).
        scope: Option<Scope>,
    },
    /// Start a turn. Accepted while the session is open, not closing, has no
    /// turn in flight, an active-session slot is free (or it holds one, see
    /// [`Policy::slots`](crate::Policy::slots)), and no shutdown has begun;
    /// the answer is [`Handled::Started`](crate::Handled::Started) with the
    /// turn's [`WorkId`], which the driver starts at once. While the previous
    /// turn was cancelled, or its start refused to its caller
    /// ([`StartRefused`](Self::StartRefused)), and it has not ended yet, the
    /// answer is [`Error::TurnSettling`](crate::Error::TurnSettling).
    StartTurn {
        /// The session whose turn starts.
        session: SessionId,
    },
    /// Start a task: work other than a turn (a tool call, a subprocess) that
    /// the session owns and that is cancelled, settled and detached like a
    /// turn. Admitted like [`StartTurn`](Self::StartTurn), also beside a turn
    /// and without a slot; answered [`Handled::Started`](crate::Handled::Started).
    StartTask {
        /// The session that owns the task.
        session: SessionId,
    },
    /// The work's provider stream is attached. If an immediate cancel has
    /// already landed, the core orders the stream closed (G4, the attach race
    /// of seed 001).
    StreamAttached {
        /// The work whose stream attached.
        work: WorkId,
    },
    /// The work's provider stream reported itself closed.
    StreamClosed {
        /// The work whose stream closed.
        work: WorkId,
    },
    /// The turn's start was refused to its caller (the store did not take
    /// it in time): the work fails on its own with the store's cause, and
    /// reports it. Until it has, a start of the session's next turn is
    /// answered [`Error::TurnSettling`](crate::Error::TurnSettling), as after
    /// a cancel, and not refused as if the turn still ran: its caller was
    /// told it has no turn. Nothing else changes: no cancel is sent (G6), and
    /// the turn ends as its work says.
    StartRefused {
        /// The turn whose start was refused.
        work: WorkId,
    },
    /// The work ended and says how (completed, failed, idle timeout, cancelled).
    WorkEnded {
        /// The work.
        work: WorkId,
        /// How it ended.
        outcome: Outcome,
    },
    /// The work exited without an outcome of its own: `cancelled` if it was
    /// asked to stop, `failed` otherwise.
    WorkExited {
        /// The work.
        work: WorkId,
    },
    /// The agent is done. Its own works are cancelled, its live descendants
    /// are cancelled first (G1) — except during a shutdown's drain, where
    /// their running turns keep the drain (G9) — and it is finalized after
    /// all of them. The end reason follows its last turn's outcome:
    /// `completed` (or no turn), `failed` (failed, idle timeout), `cancelled`
    /// (cancelled, detached, interrupted).
    AgentFinished {
        /// The finishing session.
        session: SessionId,
    },
    /// The agent's code let go of the session without finishing it: a
    /// dropped guard (an early return, a panic). Outside a shutdown it is an
    /// immediate [`Cancel`](Self::Cancel). During a shutdown the shutdown
    /// owns the session and its subtree (G9): running turns keep the drain,
    /// then everything is cancelled and finalized `shutdown`; the session is
    /// only marked closing, so it starts nothing more.
    Abandoned {
        /// The session let go of.
        session: SessionId,
    },
    /// Cancel the session: its descendants first, then its own works, all in
    /// `mode` (a graceful cancel lets every running turn of the subtree
    /// finish, each bounded by its settle deadline). The session settles when
    /// its works have exited (or were detached, G5).
    Cancel {
        /// The session to cancel.
        session: SessionId,
        /// Graceful (finish the current turn) or immediate (close the stream
        /// now), for the session and each of its descendants.
        mode: CancelMode,
    },
    /// Cancel only the turn in flight (a user pressing Ctrl-C in a chat): the
    /// session stays open for the next turn.
    CancelTurn {
        /// The session whose turn to cancel.
        session: SessionId,
    },
    /// Cancel one work (immediately): a turn whose consumer went away, a task
    /// its owner gave up on. The session stays open. A work that is not
    /// current (it already ended) is a no-op.
    CancelWork {
        /// The work to cancel.
        work: WorkId,
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
    /// `from` delegated work to `to`: when `from` is finalized while `to` is
    /// still open, `to` is cancelled (SPEC §4 step 6, "interrupt outstanding
    /// delegations"), with cause [`Cause::DelegationInterrupted`](crate::Cause::DelegationInterrupted).
    Delegate {
        /// The delegating session.
        from: SessionId,
        /// The session delegated to.
        to: SessionId,
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
    /// The registration of `session` could not be made durable (its row was
    /// not written): forget it as if it had never been registered. Accepted
    /// only while it is registered and has never run a work nor had a child
    /// (nobody could have used it yet); nothing is emitted.
    Withdraw {
        /// The session whose registration is withdrawn.
        session: SessionId,
    },
    /// The registration of `session` is durable (its row is committed).
    /// For one registered at the LRU cap
    /// ([`Handled::EvictsOnCommit`](crate::Handled::EvictsOnCommit)) the
    /// least recently active idle sessions of its scope are evicted now
    /// (`lru_evict`), as many as the cap is exceeded by, never the session
    /// itself nor its parent; fewer when fewer are idle (a registration
    /// after it needs the more room). A `NoOp` for any other session, and
    /// during a shutdown (which reclaims every session anyway). A report:
    /// answered as a work's report is for a finalized session.
    Committed {
        /// The session whose registration was committed.
        session: SessionId,
    },
    /// Sets the budget of the session and its subtree (see [`Budget`]),
    /// replacing any it had; what was spent so far under the old one is
    /// forgotten, and the wall time counts from now. Refused for a session
    /// that is closing ([`Error::Closing`](crate::Error::Closing)) or winding
    /// down ([`Error::WrongState`](crate::Error::WrongState)). Sessions under it count
    /// against it from now on, as do the ones registered later.
    SetBudget {
        /// The session.
        session: SessionId,
        /// Its limits.
        budget: Budget,
    },
    /// A work reported what it spent (a turn's usage report): counted
    /// against every budget over its session. Past a budget's tokens, that
    /// budget's subtree is wound down (`budget_exhausted`).
    Usage {
        /// The work.
        work: WorkId,
        /// The tokens its report counts.
        tokens: u64,
    },
    /// Run one automatic reclaim path now instead of waiting for its deadline.
    Sweep(Sweep),
    /// Start the graceful shutdown (G9): no new session or turn, transcripts
    /// flushed, idle sessions finalized, running turns drained until
    /// `now + drain` (a drain too long to represent lasts until
    /// [`SkipDrain`](Self::SkipDrain)).
    BeginShutdown {
        /// How long running turns may still finish.
        drain: Duration,
    },
    /// End the drain now (a second shutdown signal).
    SkipDrain,
    /// This process lost its lease on its sessions (G8): another process may
    /// recover them at any moment. Nothing may start any more and every work
    /// is cancelled now: a shutdown with no drain, whose
    /// [`ShutdownSummary::lease_lost`](crate::ShutdownSummary::lease_lost)
    /// says why.
    LeaseLost,
    /// Start a shutdown that hands the sessions off instead of ending them
    /// (SPEC §12, G12): as [`BeginShutdown`](Self::BeginShutdown), no new
    /// session or turn, transcripts flushed, running turns drained until
    /// `now + drain`; but a session with no close decided of its own is
    /// released ([`Effect::HandOff`](crate::Effect::HandOff)) instead of
    /// finalized `shutdown`, as soon as it is idle: at once for an idle
    /// one, held or not (its holds go with it), and when its turn ends for
    /// a running one. A turn still running when the drain ends is
    /// cancelled immediately and settled (G5), its session kept open, then
    /// released the same way. Children are released before their parents.
    /// A session closing for a reason of its own (a user close, a finished
    /// agent, a cancel) is finalized `shutdown` as in any shutdown; once
    /// the lease is lost (G8) nothing is released any more: it is finalized
    /// `recovered`. A second begin of either kind is a no-op.
    BeginHandoff {
        /// How long running turns may still finish.
        drain: Duration,
    },
    /// Take over a session another process released (SPEC §12): it is
    /// registered here as it was left, open and idle, with its turn count
    /// (its next turn is `turns + 1`) and the outcome of its last turn.
    /// Under its `parent` when this core has that parent registered or
    /// running and not closing; otherwise (its parent lives elsewhere, or is
    /// gone) as a root of this core. Refused like a registration: while
    /// shutting down, for an id this core keeps or finalized; at the LRU cap
    /// it is refused [`NoRoomToAdopt`](crate::Error::NoRoomToAdopt),
    /// evicting nothing (G12: the sessions it would evict may be in use). A
    /// session this core released itself may be adopted back. The tree of
    /// one of [`AdoptTree`](Self::AdoptTree). **A driver asks the store first**: its conditional update
    /// decides which process wins the session, and only the winner feeds
    /// `Adopt`; a refusal means the driver releases the session again.
    /// (Fed before the store answers, the core could reap the session or
    /// hand it off while the store still has it released, and a sweeper of
    /// another process finalize it too.) [`Withdraw`](Self::Withdraw) admits
    /// an adopted session until it runs a work or has a child.
    Adopt(Adoptee),
    /// Take over a tree of sessions another process released, as one (SPEC
    /// §12, G1): every member is adopted as [`Adopt`](Self::Adopt) adopts
    /// one, or none is. A member whose parent is another member is adopted
    /// under it (the core orders parents before their children, whatever
    /// the order given); the others under their parent when this core may
    /// give it one, as roots otherwise. Refused, adopting nothing and
    /// evicting nothing: while shutting down; with
    /// [`DuplicateSession`](crate::Error::DuplicateSession) for the first
    /// member this core keeps or finalized (or named twice); and with
    /// [`NoRoomToAdopt`](crate::Error::NoRoomToAdopt) when the LRU cap has
    /// no room for them all. A tree is never split between processes: a
    /// child left released here could be adopted elsewhere under a parent
    /// this core owns, and closing the parent would not wind it down
    /// first. An empty tree is a `NoOp`.
    AdoptTree {
        /// The tree's sessions.
        members: Vec<Adoptee>,
    },
}

/// What a held session waits on (SPEC §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "snake_case")
)]
pub enum Hold {
    /// Input it asked a person for.
    PendingInput,
    /// A delegation to another session that is still outstanding.
    Delegation,
}

/// How many holds of each kind a session has (SPEC §5): none makes it
/// reclaimable by no automatic path. A handoff carries them to the process
/// that adopts the session ([`HandOff`](crate::HandOff),
/// [`Event::Adopt`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Holds {
    /// Input it asked a person for ([`Hold::PendingInput`]).
    pub pending_input: u16,
    /// Delegations still outstanding ([`Hold::Delegation`]).
    pub delegation: u16,
}

impl Holds {
    /// Whether it has no hold.
    pub fn is_empty(&self) -> bool {
        self.pending_input == 0 && self.delegation == 0
    }

    /// The count of `hold`'s kind.
    pub(crate) fn slot(&mut self, hold: Hold) -> &mut u16 {
        match hold {
            Hold::PendingInput => &mut self.pending_input,
            Hold::Delegation => &mut self.delegation,
        }
    }
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
