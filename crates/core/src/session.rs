use std::time::Instant;

use crate::budget::Spent;
use crate::deadlines::IdleMark;
use crate::{CancelMode, EndReason, Holds, Outcome, Scope, SessionId, State, WorkId, WorkKind};

/// The core's record of one session. Kept small: an idle session costs a few
/// hundred bytes (SPEC §9).
#[derive(Debug, Clone)]
pub(crate) struct Session {
    pub parent: Option<SessionId>,
    /// The sessions it spawned, in registration order; forgotten ones linger
    /// until they are half of the list (see `Core::forget`).
    pub children: Vec<SessionId>,
    /// How many of `children` were forgotten.
    pub forgotten_children: u32,
    pub state: State,
    /// Children still `registered`, `running` or `cancelling`.
    pub unsettled_children: u32,
    /// Children not yet `finalized` (G1: finalize waits for zero).
    pub unfinalized_children: u32,
    /// The works in flight: at most one turn, any number of tasks.
    pub works: Works,
    /// Turns started so far (the next turn is `turns + 1`).
    pub turns: u32,
    /// Tasks started so far.
    pub tasks: u32,
    /// Turns it had run elsewhere when it was adopted here (0 for one
    /// registered here): a withdrawal admits it while `turns` is still that.
    pub entry_turns: u32,
    pub last_outcome: Option<Outcome>,
    /// How its last task ended: what its record says it ended with when it
    /// ran no turn (SPEC §7).
    pub last_task_outcome: Option<Outcome>,
    /// The close intent: once set, the session admits no new turn and is
    /// finalized as soon as it may be.
    pub intent: Option<Intent>,
    pub holds: Holds,
    pub transport: Transport,
    /// A turn was running when the shutdown began (for its summary).
    pub running_at_shutdown: bool,
    /// It holds an active-session slot (taken with its first turn).
    pub has_slot: bool,
    /// The last time it became idle (registered, turn ended, hold released).
    pub idle_since: Instant,
    /// Its place in the idle index (see `Deadlines::set_idle`).
    pub idle: IdleMark,
    pub orphan_deadline: Option<Instant>,
    /// Its own budget and what its subtree spent (boxed: most sessions
    /// have none, and an idle one stays small).
    pub budget: Option<Box<Spent>>,
    /// It or an ancestor has a budget: its turns and usage are counted.
    pub budgeted: bool,
    /// Whose it is, for the LRU cap: only a registration of the same scope
    /// evicts it.
    pub scope: Scope,
    /// Registered at the LRU cap: the sessions that make room for it are
    /// evicted once its registration is committed
    /// ([`Event::Committed`](crate::Event::Committed)), not before, so a
    /// registration the store refuses evicts no one.
    pub room_owed: bool,
}

/// Where a session stands once one of its works ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Left {
    /// Other works of it are still live.
    Busy,
    /// Its last work ended while it was running: it is open and idle again;
    /// `closing` when a close waits for that (an intent, a pending reclaim).
    Idle { closing: bool },
    /// Its last work ended while it was winding down (cancelling, settled).
    WindingDown,
}

/// Why a session will be finalized, once that is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Intent {
    /// The agent finished: the end reason follows the last turn's outcome,
    /// which may still change while its works unwind.
    Finished,
    /// Ends with this reason.
    End(EndReason),
    /// Released for another process to adopt once it is idle (a handoff,
    /// SPEC §12); finalized `shutdown` if it has to be finalized instead.
    HandOff,
}

impl Intent {
    /// The end reason this intent gives a session whose last turn ended with `last`.
    pub fn reason(self, last: Option<Outcome>) -> EndReason {
        match self {
            Intent::End(reason) => reason,
            Intent::HandOff => EndReason::Shutdown,
            Intent::Finished => match last {
                None | Some(Outcome::Completed) => EndReason::Completed,
                Some(Outcome::Failed | Outcome::IdleTimeout) => EndReason::Failed,
                Some(Outcome::Cancelled | Outcome::Detached | Outcome::Interrupted) => {
                    EndReason::Cancelled
                }
            },
        }
    }
}

impl Session {
    pub fn new(parent: Option<SessionId>, now: Instant) -> Self {
        Session {
            parent,
            children: Vec::new(),
            forgotten_children: 0,
            state: State::Registered,
            unsettled_children: 0,
            unfinalized_children: 0,
            works: Works::default(),
            turns: 0,
            tasks: 0,
            entry_turns: 0,
            last_outcome: None,
            last_task_outcome: None,
            intent: None,
            holds: Holds::default(),
            transport: Transport::default(),
            running_at_shutdown: false,
            has_slot: false,
            idle_since: now,
            idle: IdleMark::default(),
            orphan_deadline: None,
            budget: None,
            budgeted: false,
            scope: Scope::SHARED,
            room_owed: false,
        }
    }

    /// Records the end of a work already taken out of [`works`](Self::works):
    /// a turn's outcome is the last outcome, and a running session left
    /// without work is idle from `now`. Says where that leaves the session.
    pub fn work_ended(&mut self, kind: WorkKind, outcome: Outcome, now: Instant) -> Left {
        match kind {
            WorkKind::Turn => self.last_outcome = Some(outcome),
            WorkKind::Task => self.last_task_outcome = Some(outcome),
        }
        if !self.works.is_empty() {
            return Left::Busy;
        }
        if self.state != State::Running {
            return Left::WindingDown;
        }
        self.idle_since = now;
        Left::Idle {
            closing: self.intent.is_some() || self.transport.pending.is_some(),
        }
    }

    /// The reclaim predicate shared by every automatic path (SPEC §5, G3):
    /// registered, no work, not already closing, no hold, and no child that
    /// still has to be finalized first (G1).
    pub fn is_reclaimable(&self) -> bool {
        self.state == State::Registered
            && self.works.is_empty()
            && self.intent.is_none()
            && self.holds.is_empty()
            && self.unfinalized_children == 0
    }
}

/// The works of a session in flight. The turn has its own slot, so the common
/// case (one turn, no task) never allocates.
#[derive(Debug, Clone, Default)]
pub(crate) struct Works {
    pub turn: Option<Work>,
    pub tasks: Vec<Work>,
}

impl Works {
    pub fn is_empty(&self) -> bool {
        self.turn.is_none() && self.tasks.is_empty()
    }

    pub fn get_mut(&mut self, kind: WorkKind, no: u32) -> Option<&mut Work> {
        match kind {
            WorkKind::Turn => self.turn.as_mut().filter(|w| w.no == no),
            WorkKind::Task => self.tasks.iter_mut().find(|w| w.no == no),
        }
    }

    pub fn take(&mut self, kind: WorkKind, no: u32) -> Option<Work> {
        match kind {
            WorkKind::Turn => self.turn.take_if(|w| w.no == no),
            WorkKind::Task => {
                let at = self.tasks.iter().position(|w| w.no == no)?;
                Some(self.tasks.swap_remove(at))
            }
        }
    }

    pub fn iter_mut(&mut self) -> impl Iterator<Item = &mut Work> {
        self.turn.iter_mut().chain(self.tasks.iter_mut())
    }

    pub fn iter(&self) -> impl Iterator<Item = &Work> {
        self.turn.iter().chain(self.tasks.iter())
    }
}

/// One work in flight.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Work {
    pub kind: WorkKind,
    pub no: u32,
    pub stream_attached: bool,
    pub stream_closed: bool,
    /// The one cancel this work was sent (G6).
    pub cancel: Option<CancelMode>,
    /// Whether a `CloseStream` was already emitted for it (G4).
    pub close_sent: bool,
    /// Whether its start was refused to its caller: it is ending.
    pub start_refused: bool,
    /// Its settle deadline, once it was cancelled (G5).
    pub settle_at: Option<Instant>,
}

impl Work {
    pub fn new(kind: WorkKind, no: u32) -> Self {
        Work {
            kind,
            no,
            stream_attached: false,
            stream_closed: false,
            cancel: None,
            close_sent: false,
            start_refused: false,
            settle_at: None,
        }
    }

    pub fn id(&self, session: SessionId) -> WorkId {
        WorkId {
            session,
            kind: self.kind,
            no: self.no,
        }
    }

    /// The stream is attached and nobody closed it or asked for it to be closed.
    pub fn stream_needs_close(&self) -> bool {
        self.stream_attached && !self.stream_closed && !self.close_sent
    }
}

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Transport {
    pub attached: u16,
    pub close_on_disconnect: bool,
    /// A reclaim that found the session busy and waits for it: a
    /// close-on-disconnect transport dropped (`transport_closed`), or a zero
    /// orphan grace ran out (`orphan_reap`). It claims the session as soon as
    /// it is reclaimable with no transport attached.
    pub pending: Option<EndReason>,
}
