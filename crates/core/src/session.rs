use std::time::Instant;

use crate::{CancelMode, EndReason, Hold, Outcome, SessionId, State, WorkId};

/// The core's record of one session. Kept small: an idle session costs a few
/// hundred bytes (SPEC §9).
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub parent: Option<SessionId>,
    pub children: Vec<SessionId>,
    pub state: State,
    /// Children still `registered`, `running` or `cancelling`.
    pub unsettled_children: u32,
    /// Children not yet `finalized` (G1: finalize waits for zero).
    pub unfinalized_children: u32,
    /// The current turn's work, from `StartTurn` until it exits or is detached.
    pub work: Option<Work>,
    pub turns: u32,
    pub last_outcome: Option<Outcome>,
    /// The close intent: once set, the session admits no new turn and is
    /// finalized with this reason as soon as it may be.
    pub closing: Option<EndReason>,
    pub holds: Holds,
    pub transport: Transport,
    /// The last time it became idle (registered, turn ended, hold released).
    pub idle_since: Instant,
    /// The key under which it sits in the idle index, if it is reclaimable.
    pub indexed_since: Option<Instant>,
    /// The key of this session's one entry in the idle heap, if it has one:
    /// a lower bound of `indexed_since`, re-armed when it surfaces early.
    pub idle_key: Option<Instant>,
    pub settle_deadline: Option<Instant>,
    pub orphan_deadline: Option<Instant>,
}

impl Session {
    pub fn new(parent: Option<SessionId>, now: Instant) -> Self {
        Session {
            parent,
            children: Vec::new(),
            state: State::Registered,
            unsettled_children: 0,
            unfinalized_children: 0,
            work: None,
            turns: 0,
            last_outcome: None,
            closing: None,
            holds: Holds::default(),
            transport: Transport::default(),
            idle_since: now,
            indexed_since: None,
            idle_key: None,
            settle_deadline: None,
            orphan_deadline: None,
        }
    }

    /// The reclaim predicate shared by every automatic path (SPEC §5, G3):
    /// registered, no turn, not already closing, no hold, and no child that
    /// still has to be finalized first (G1).
    pub fn is_reclaimable(&self) -> bool {
        self.state == State::Registered
            && self.work.is_none()
            && self.closing.is_none()
            && self.holds.is_empty()
            && self.unfinalized_children == 0
    }
}

/// The work of the turn in flight.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work {
    pub turn: u32,
    pub stream_attached: bool,
    pub stream_closed: bool,
    /// The one cancel this work was sent (G6).
    pub cancel: Option<CancelMode>,
    /// Whether a `CloseStream` was already emitted for it (G4).
    pub close_sent: bool,
    /// The cancel targets only the turn; the session stays open.
    pub turn_only: bool,
}

impl Work {
    pub fn new(turn: u32) -> Self {
        Work {
            turn,
            stream_attached: false,
            stream_closed: false,
            cancel: None,
            close_sent: false,
            turn_only: false,
        }
    }

    pub fn id(&self, session: SessionId) -> WorkId {
        WorkId {
            session,
            turn: self.turn,
        }
    }

    /// The stream is attached and nobody closed it or asked for it to be closed.
    pub fn stream_needs_close(&self) -> bool {
        self.stream_attached && !self.stream_closed && !self.close_sent
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Holds {
    pub pending_input: u16,
    pub delegation: u16,
}

impl Holds {
    pub fn is_empty(&self) -> bool {
        self.pending_input == 0 && self.delegation == 0
    }

    pub fn slot(&mut self, hold: Hold) -> &mut u16 {
        match hold {
            Hold::PendingInput => &mut self.pending_input,
            Hold::Delegation => &mut self.delegation,
        }
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Transport {
    pub attached: u16,
    pub close_on_disconnect: bool,
    /// A close-on-disconnect transport dropped while a turn was live: claim
    /// the session as soon as it is reclaimable again.
    pub close_pending: bool,
}

/// A read-only view of one session, for drivers and tests.
#[derive(Debug, Clone, Copy)]
pub struct SessionView<'a> {
    pub(crate) id: SessionId,
    pub(crate) inner: &'a Session,
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
    /// The sessions it spawned, in registration order.
    pub fn children(&self) -> &'a [SessionId] {
        &self.inner.children
    }
    /// How many turns it has started.
    pub fn turns(&self) -> u32 {
        self.inner.turns
    }
    /// The work of the turn in flight, if any.
    pub fn work(&self) -> Option<WorkId> {
        self.inner.work.map(|w| w.id(self.id))
    }
    /// The cancel its current work was sent, if any.
    pub fn work_cancel(&self) -> Option<CancelMode> {
        self.inner.work.and_then(|w| w.cancel)
    }
    /// The outcome of its last turn (or of its work, if detached).
    pub fn last_outcome(&self) -> Option<Outcome> {
        self.inner.last_outcome
    }
    /// Why it is closing (or was finalized), once a close was decided.
    pub fn closing(&self) -> Option<EndReason> {
        self.inner.closing
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
    /// Its pending settle deadline, if its work is being cancelled.
    pub fn settle_deadline(&self) -> Option<Instant> {
        self.inner.settle_deadline
    }
}
