//! The lifecycle state machine. Every transition of SPEC §2 happens in this
//! file, through [`move_state`], which asserts [`State::can_move_to`].
//! Handing sessions off and adopting them (SPEC §12), which move no state,
//! are in [`handoff`].

mod handoff;

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::answer::{self, Asks, Found};
use crate::budget::Spent;
use crate::deadlines::{Deadline, Deadlines, Timer};
use crate::forgotten::Forgotten;
use crate::hash::SessionMap;
use crate::session::{Intent, Left, Session, Work};
use crate::sessions::Sessions;
use crate::tree::{open_descendants_bottom_up, open_sessions_bottom_up};
use crate::view::SessionView;
use crate::{
    Budget, BudgetLimit, CancelMode, Cause, Effect, EndReason, Error, Event, Finalize, Handled,
    Hold, Move, Outcome, Policy, Scope, SessionId, ShutdownSummary, State, Sweep, Transition,
    Transitions, WorkId, WorkKind,
};

/// The sans-IO lifecycle kernel for one tree (or forest) of agent sessions.
///
/// Inputs: [`handle`](Self::handle) and [`handle_timeout`](Self::handle_timeout),
/// each with the current time. Outputs: [`poll_effect`](Self::poll_effect) and
/// [`poll_timeout`](Self::poll_timeout).
///
/// **After every input, drain `poll_effect` until it returns `None`, then ask
/// `poll_timeout`, before the next input.** Effects are ordered: descendants
/// are cancelled before ancestors and finalized before them (G1).
#[derive(Debug)]
pub struct Core {
    policy: Policy,
    sessions: Sessions,
    /// The ids of finalized sessions whose record was forgotten.
    forgotten: Forgotten,
    /// Delegations outstanding, by delegating session (SPEC §4 step 6).
    delegations: SessionMap<Vec<SessionId>>,
    /// Sessions delegated to by a session finalized during this input, to
    /// interrupt once the input's cascade is over.
    interrupts: Vec<SessionId>,
    /// Sessions holding an active-session slot.
    slots_taken: usize,
    effects: VecDeque<Effect>,
    deadlines: Deadlines,
    /// Sessions not yet finalized.
    open: usize,
    /// Of those, the ones registered at the LRU cap whose registration is
    /// not committed yet (`Session::room_owed`): the cap's room is made
    /// for the others only.
    owing: usize,
    shutdown: Option<Shutdown>,
    /// The lease on the sessions was lost: what is finalized from then on
    /// is the store's to end by recovery, and ends `recovered` (G8).
    lease_lost: bool,
    /// The latest `now` seen: time never runs backwards inside the core.
    now: Option<Instant>,
    /// Sessions handed off to another process (SPEC §12).
    handed_off: SessionMap<()>,
    /// While a subtree's cancel gathers its orders into set effects (see
    /// [`Core::cancel_subtree`]): its transitions and its works' cancels.
    gathering: Option<Box<Gathered>>,
}

/// The orders of a subtree's cancel, gathered into its two set effects.
#[derive(Debug)]
struct Gathered {
    at: Instant,
    cause: Cause,
    mode: CancelMode,
    moves: Vec<Move>,
    works: Vec<WorkId>,
}

#[derive(Debug)]
struct Shutdown {
    drained: bool,
    complete_sent: bool,
    summary: ShutdownSummary,
}

impl Core {
    /// A core with no sessions.
    pub fn new(policy: Policy) -> Self {
        Core {
            policy,
            sessions: Sessions::default(),
            forgotten: Forgotten::default(),
            delegations: SessionMap::default(),
            interrupts: Vec::new(),
            slots_taken: 0,
            effects: VecDeque::new(),
            deadlines: Deadlines::default(),
            open: 0,
            owing: 0,
            shutdown: None,
            lease_lost: false,
            now: None,
            handed_off: SessionMap::default(),
            gathering: None,
        }
    }

    /// The policy it was built with.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Feeds one input. On `Err` nothing changed and no effect was queued,
    /// with one exception: a turn refused with
    /// [`Error::BudgetExhausted`] has spent its budget's last turn, and the
    /// budget's subtree is wound down in the same input (drain the effects
    /// as after any input).
    ///
    /// Every input naming a session is first answered by one table (see
    /// [`Event`]) when the session is finalized, forgotten, closing, winding
    /// down or unknown; only the rest reach their handler.
    pub fn handle(&mut self, now: Instant, event: Event) -> Result<Handled, Error> {
        let now = self.clock(now);
        if let Some((id, asks)) = answer::subject(&event) {
            // The hottest handlers apply the table on their own lookup.
            if !answer::admitted_by_handler(&event) {
                if let Some(answered) = self.answer(id, asks) {
                    return answered;
                }
            }
        }
        let handled = match event {
            Event::Register {
                session,
                parent,
                scope,
            } => self.register(now, session, parent, scope),
            Event::StartTurn { session } => self.start_work(now, session, WorkKind::Turn),
            Event::StartTask { session } => self.start_work(now, session, WorkKind::Task),
            Event::StreamAttached { work } => self.stream_attached(work),
            Event::StreamClosed { work } => self.stream_closed(work),
            Event::StartRefused { work } => self.start_refused(work),
            Event::WorkEnded { work, outcome } => self.work_reported(now, work, Some(outcome)),
            Event::WorkExited { work } => self.work_reported(now, work, None),
            Event::AgentFinished { session } => self.agent_finished(now, session),
            Event::Abandoned { session } => Ok(self.abandoned(now, session)),
            Event::Cancel { session, mode } => {
                let (intent, cause) = (EndReason::Cancelled, Cause::CancelRequested(mode));
                self.cancel(now, session, mode, intent, cause, EndReason::Cancelled)
            }
            Event::CancelTurn { session } => self.cancel_turn(now, session),
            Event::CancelWork { work } => self.cancel_work(now, work),
            Event::Withdraw { session } => self.withdraw(now, session),
            Event::Committed { session } => Ok(self.committed(now, session)),
            Event::CancelDescendants { session } => self.cancel_descendants(now, session),
            Event::UserClose { session } => {
                let mode = CancelMode::Immediate;
                let (reason, cause) = (EndReason::UserClose, Cause::UserClose);
                self.cancel(now, session, mode, reason, cause, EndReason::Cancelled)
            }
            Event::Delegate { from, to } => self.delegate(from, to),
            Event::Hold { session, hold } => self.hold(session, hold),
            Event::Release { session, hold } => self.release(now, session, hold),
            Event::TransportAttached {
                session,
                close_on_disconnect,
            } => Ok(self.transport_attached(session, close_on_disconnect)),
            Event::TransportDetached { session } => self.transport_detached(now, session),
            Event::SetBudget { session, budget } => self.set_budget(now, session, budget),
            Event::Usage { work, tokens } => Ok(self.usage(now, work, tokens)),
            Event::Sweep(sweep) => Ok(self.sweep(now, sweep)),
            Event::BeginShutdown { drain } => Ok(self.begin_shutdown(now, drain)),
            Event::SkipDrain => Ok(self.skip_drain(now)),
            Event::LeaseLost => Ok(self.lease_lost(now)),
            Event::BeginHandoff { drain } => Ok(self.begin(now, drain, true)),
            Event::Adopt(one) => self.adopt(now, vec![one]),
            Event::AdoptTree { members } => self.adopt(now, members),
        };
        if !self.interrupts.is_empty() {
            self.interrupt_delegations(now);
        }
        self.after_input();
        handled
    }

    /// Processes every deadline due at `now`: settle deadlines (detach, G5),
    /// the drain deadline, orphan grace and idle TTL. Pass the current time,
    /// not the deadline that woke you. Spurious calls are harmless no-ops.
    /// Afterwards [`poll_timeout`](Self::poll_timeout) names a time after `now`.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock(now);
        if self.deadlines.drain.is_some_and(|at| at <= now) {
            self.end_drain(now);
        }
        // Delegations interrupted by what the deadlines or the idle reap
        // finalized cancel works (whose settle deadline may be due at once
        // with a zero settle timeout) and free parents for the reap: go on
        // until nothing more is due.
        loop {
            while let Some((at, id, timer)) = self.deadlines.pop_due(now) {
                match timer {
                    Timer::Settle(kind, no) => self.settle_deadline(now, id, kind, no, at),
                    Timer::Budget => {
                        // Only while it matters: a session winding down
                        // already spends nothing more.
                        let due = self
                            .sessions
                            .get(&id)
                            .filter(|s| s.state.is_active())
                            .and_then(|s| s.budget.as_ref());
                        if due.is_some_and(|b| b.deadline == Some(at) && !b.exhausted) {
                            self.exhaust(now, id, BudgetLimit::WallTime);
                        }
                    }
                    Timer::Orphan => {
                        let due = self
                            .sessions
                            .get(&id)
                            .is_some_and(|s| s.orphan_deadline == Some(at));
                        if due {
                            self.orphan_deadline(now, id);
                        }
                    }
                }
            }
            self.reap_idle(now);
            if self.interrupts.is_empty() {
                break;
            }
            self.interrupt_delegations(now);
        }
        self.prune_stale();
        self.after_input();
    }

    /// The next effect to execute, in order. Drain until `None` after every input.
    #[inline]
    pub fn poll_effect(&mut self) -> Option<Effect> {
        self.effects.pop_front()
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next, if ever,
    /// and why. Call again after every input: deadlines move. It may name a
    /// deadline that was cancelled since (a work that exited before its settle
    /// deadline); the wake is then a harmless no-op.
    pub fn poll_timeout(&self) -> Option<Deadline> {
        self.deadlines.next(self.policy.idle_ttl)
    }

    /// Whether a session could be registered under `parent` right now, without
    /// registering it: the same answer [`Event::Register`] would give for a
    /// fresh id.
    pub fn check_register(&self, parent: Option<SessionId>) -> Result<(), Error> {
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        match parent.and_then(|p| self.answer(p, Asks::Parent)) {
            Some(Err(refused)) => Err(refused),
            _ => Ok(()),
        }
    }

    /// The state of a session, finalized ones included after
    /// [`forget`](Self::forget): `None` only for an id never registered here
    /// (or withdrawn), or handed off to another process.
    pub fn state(&self, id: SessionId) -> Option<State> {
        match self.find(id) {
            Found::Kept(s) => Some(s.state),
            Found::Forgotten => Some(State::Finalized),
            // Another process's now ([`is_handed_off`](Self::is_handed_off)).
            Found::HandedOff | Found::Unknown => None,
        }
    }

    /// A view of one session, finalized ones included until [`forget`](Self::forget).
    pub fn session(&self, id: SessionId) -> Option<SessionView<'_>> {
        self.sessions.get(&id).map(|inner| SessionView {
            id,
            inner,
            sessions: &self.sessions,
        })
    }

    /// Every known session, in no particular order.
    pub fn sessions(&self) -> impl Iterator<Item = SessionView<'_>> {
        self.sessions.iter().map(|(id, inner)| SessionView {
            id,
            inner,
            sessions: &self.sessions,
        })
    }

    /// How many sessions are not yet finalized.
    pub fn open_sessions(&self) -> usize {
        self.open
    }

    /// Whether shutdown has begun.
    pub fn is_shutting_down(&self) -> bool {
        self.shutdown.is_some()
    }

    /// Whether shutdown has begun and its drain period is over.
    pub fn is_drained(&self) -> bool {
        self.shutdown.as_ref().is_some_and(|s| s.drained)
    }

    /// Drops the record of a finalized session, so a long-lived process does
    /// not keep one per session it ever ran: a driver calls it once it has
    /// executed the session's [`Effect::Finalize`]. Returns whether it was
    /// dropped; sessions that are not finalized are kept. The id is still
    /// remembered, compactly: every input naming it gets the answer of a
    /// finalized session (the table on [`Event`]), and
    /// [`state`](Self::state) says `finalized`.
    pub fn forget(&mut self, id: SessionId) -> bool {
        let Some(s) = self.sessions.remove_if(id, |s| s.state == State::Finalized) else {
            return false;
        };
        self.forgotten.insert(id);
        // The deadline table drops the entries of forgotten sessions once
        // they could be half of it, so that nothing stays per session.
        // A forgotten id is never kept: its bit answers without a lookup.
        let (sessions, forgotten) = (&self.sessions, &self.forgotten);
        self.deadlines.compact(sessions.len(), |id| {
            !forgotten.contains(id) && sessions.contains_key(&id)
        });
        // A parent's list keeps its forgotten children until they are half
        // of it, then drops them all at once: forgetting a wide tree's
        // children one by one stays linear, not quadratic.
        let Some(parent) = s.parent else { return true };
        let compact = match self.sessions.get_mut(&parent) {
            Some(p) => {
                p.forgotten_children += 1;
                p.forgotten_children as usize * 2 >= p.children.len()
            }
            None => false,
        };
        if compact {
            let mut children = self
                .sessions
                .get_mut(&parent)
                .map(|p| std::mem::take(&mut p.children))
                .unwrap_or_default();
            children.retain(|c| self.sessions.contains_key(c));
            if let Some(p) = self.sessions.get_mut(&parent) {
                p.children = children;
                p.forgotten_children = 0;
            }
        }
        true
    }

    /// Remembers `id` as finalized when the store says so (a session of an
    /// earlier run, or finalized by another process): from now on every
    /// input naming it gets a finalized session's answer (the table on
    /// [`Event`]), and [`state`](Self::state) says `finalized`. Returns
    /// whether it was new to the core; a session the core keeps is left as
    /// it is.
    pub fn remember_finalized(&mut self, id: SessionId) -> bool {
        if self.sessions.contains_key(&id) || self.forgotten.contains(id) {
            return false;
        }
        self.forgotten.insert(id);
        true
    }

    // ----- inputs ---------------------------------------------------------

    fn register(
        &mut self,
        now: Instant,
        id: SessionId,
        parent: Option<SessionId>,
        scope: Option<Scope>,
    ) -> Result<Handled, Error> {
        if self.forgotten.contains(id) {
            return Err(Error::DuplicateSession(id));
        }
        // Unnamed, its parent's (a parent that passes the check is kept).
        let scope = scope
            .or_else(|| parent.and_then(|p| self.sessions.get(&p)).map(|p| p.scope))
            .unwrap_or(Scope::SHARED);
        // A kept id is refused before anything else, but only a refusal
        // asks: the id is looked up once, where its record is kept.
        let admitted = self
            .check_register(parent)
            .and_then(|()| self.room_for(parent, scope));
        let victims = match admitted {
            Ok(victims) => victims,
            Err(_) if self.sessions.contains_key(&id) => return Err(Error::DuplicateSession(id)),
            Err(refused) => return Err(refused),
        };
        // At the cap the room is made once the registration is committed
        // (`Event::Committed`): one the store refuses evicts no one.
        let owed = !victims.is_empty();
        let make = || {
            let mut s = Session::new(parent, now);
            s.scope = scope;
            s.room_owed = owed;
            s
        };
        self.enter(now, id, parent, make, Vec::new(), Cause::Registered)?;
        self.owing += usize::from(owed);
        Ok(match owed {
            true => Handled::EvictsOnCommit,
            false => Handled::Applied,
        })
    }

    /// [`Event::Committed`]: the room a registration at the cap owed is
    /// made now, as far as idle sessions of its scope allow.
    fn committed(&mut self, now: Instant, id: SessionId) -> Handled {
        let shutting_down = self.shutdown.is_some();
        let Some(s) = self.sessions.get_mut(&id) else {
            return Handled::NoOp;
        };
        if !std::mem::take(&mut s.room_owed) {
            return Handled::NoOp;
        }
        self.owing -= 1;
        if shutting_down {
            return Handled::NoOp;
        }
        let (parent, scope) = (s.parent, s.scope);
        // What the committed sessions exceed the cap by, made among the
        // committed ones: the room a registration still in flight needs is
        // made when it commits, and none if it is withdrawn.
        let needed = match self.policy.lru_cap {
            Some(cap) => (self.open - self.owing).saturating_sub(cap),
            None => 0,
        };
        let spare = [parent, Some(id)];
        let victims = self
            .deadlines
            .oldest_idle(&mut self.sessions, needed, spare, scope, true);
        if victims.is_empty() {
            return Handled::NoOp;
        }
        self.evict(now, victims);
        Handled::Applied
    }

    /// Keeps the new record of `id` (registered or adopted), which `make`
    /// makes under `parent`, and evicts `victims` to make room for it;
    /// refused, changing nothing, when `id` is kept already. The record is
    /// made where it is kept, not moved there.
    fn enter(
        &mut self,
        now: Instant,
        id: SessionId,
        parent: Option<SessionId>,
        make: impl FnOnce() -> Session,
        victims: Vec<SessionId>,
        cause: Cause,
    ) -> Result<(), Error> {
        // A budget over the parent counts this session too.
        let budgeted = parent
            .and_then(|p| self.sessions.get(&p))
            .is_some_and(|p| p.budgeted);
        let Some(s) = self.sessions.insert_new(id, make) else {
            return Err(Error::DuplicateSession(id));
        };
        debug_assert_eq!(s.parent, parent);
        s.budgeted = budgeted;
        index(s, id, false, &mut self.deadlines);
        let mut parent_was_childless = false;
        if let Some(p) = parent.and_then(|p| self.sessions.get_mut(&p)) {
            p.children.push(id);
            p.unsettled_children += 1;
            p.unfinalized_children += 1;
            parent_was_childless = p.unfinalized_children == 1;
        }
        self.open += 1;
        self.record(now, id, None, State::Registered, cause);
        if let (Some(p), true) = (parent, parent_was_childless) {
            // It has a child to finalize first now: no longer reclaimable (G1).
            self.refresh_index(p);
        }
        // Evicted once the new session is a child of its parent: evicting
        // its last sibling cannot then finalize the parent (a pending
        // reclaim waiting for its children) under it (G1).
        self.evict(now, victims);
        Ok(())
    }

    /// Claims each of `victims` (idle, found by
    /// [`room_for`](Self::room_for)) for the LRU cap.
    fn evict(&mut self, now: Instant, victims: Vec<SessionId>) {
        for id in victims {
            if let Some(s) = self.sessions.get_mut(&id) {
                self.deadlines.unindex_idle(&mut s.idle);
            }
            self.claim(now, id, EndReason::LruEvict);
        }
    }

    /// The sessions to evict to make room under the LRU cap for one more
    /// of `scope` (under `parent`): the least recently active idle ones of
    /// that scope, the parent spared (its child makes it busy), so that
    /// the new session is never the one evicted, nor a session of another
    /// scope, nor one whose own registration waits for its commit.
    /// Refused, changing nothing, when too few can be. A registration
    /// evicts them once it is committed (`committed`), an adoption at once.
    fn room_for(
        &mut self,
        parent: Option<SessionId>,
        scope: Scope,
    ) -> Result<Vec<SessionId>, Error> {
        let Some(cap) = self.policy.lru_cap else {
            return Ok(Vec::new());
        };
        let needed = (self.open + 1).saturating_sub(cap);
        if needed == 0 {
            return Ok(Vec::new());
        }
        let victims =
            self.deadlines
                .oldest_idle(&mut self.sessions, needed, [parent, None], scope, false);
        if victims.len() < needed {
            return Err(Error::OverCapacity { cap });
        }
        Ok(victims)
    }

    fn start_work(
        &mut self,
        now: Instant,
        id: SessionId,
        kind: WorkKind,
    ) -> Result<Handled, Error> {
        let slots = self.policy.slots;
        let slots_free = slots.is_none_or(|n| self.slots_taken < n);
        let shutting_down = self.shutdown.is_some();
        let asks = Asks::Start(kind);
        let (sessions, forgotten, handed_off) =
            (&mut self.sessions, &self.forgotten, &self.handed_off);
        let s = match answer::admit(sessions, forgotten, handed_off, id, asks, shutting_down) {
            Ok(s) => s,
            Err(answered) => return answered,
        };
        if kind == WorkKind::Turn {
            if let Some(turn) = s.works.turn {
                // Ending: cancelled, or its start refused to its caller.
                let ending = turn.cancel.is_some() || turn.start_refused;
                return Err(match ending {
                    true => Error::TurnSettling {
                        session: id,
                        turn: turn.no,
                    },
                    false => wrong_state(id, s.state, "start a turn"),
                });
            }
        }
        let counted = kind == WorkKind::Turn && s.budgeted;
        // Found once, unless a budget is asked about the tree above it.
        let s = match counted {
            false => s,
            true => {
                // The one refusal that changes something: the budget that
                // has no turn left winds its subtree down.
                if let Some(owner) = self.turns_spent(id) {
                    self.exhaust(now, owner, BudgetLimit::Turns);
                    return Err(Error::BudgetExhausted {
                        session: owner,
                        limit: BudgetLimit::Turns,
                    });
                }
                let Some(s) = self.sessions.get_mut(&id) else {
                    return Err(Error::UnknownSession(id));
                };
                s
            }
        };
        if kind == WorkKind::Turn && !s.has_slot {
            if !slots_free {
                return Err(Error::NoSlot {
                    slots: slots.unwrap_or_default(),
                });
            }
            s.has_slot = true;
            self.slots_taken += 1;
        }
        let from = s.state;
        let work = match kind {
            WorkKind::Turn => {
                s.turns += 1;
                let work = Work::new(kind, s.turns);
                s.works.turn = Some(work);
                work
            }
            WorkKind::Task => {
                s.tasks += 1;
                let work = Work::new(kind, s.tasks);
                s.works.tasks.push(work);
                work
            }
        };
        if from == State::Registered {
            let cause = match kind {
                WorkKind::Turn => Cause::TurnStarted,
                WorkKind::Task => Cause::TaskStarted,
            };
            let m = move_state(s, id, State::Running, cause, false, &mut self.deadlines);
            self.moved(now, id, m);
        }
        if counted {
            self.spend(id, |spent| spent.turns += 1);
        }
        Ok(Handled::Started(work.id(id)))
    }

    fn stream_attached(&mut self, work: WorkId) -> Result<Handled, Error> {
        let Some(w) = self.work_mut(work) else {
            return Ok(Handled::NoOp);
        };
        if w.stream_attached {
            return Ok(Handled::NoOp);
        }
        w.stream_attached = true;
        // The attach race of seed 001: an immediate cancel landed before the
        // stream was attached, so the work may never see it; close it from here.
        if w.cancel == Some(CancelMode::Immediate) && w.stream_needs_close() {
            w.close_sent = true;
            self.effects.push_back(Effect::CloseStream { work });
        }
        Ok(Handled::Applied)
    }

    fn stream_closed(&mut self, work: WorkId) -> Result<Handled, Error> {
        match self.work_mut(work) {
            Some(w) if !w.stream_closed => {
                w.stream_closed = true;
                Ok(Handled::Applied)
            }
            _ => Ok(Handled::NoOp),
        }
    }

    /// A turn's start was refused to its caller: it is ending.
    fn start_refused(&mut self, work: WorkId) -> Result<Handled, Error> {
        match self.work_mut(work) {
            Some(w) if w.kind == WorkKind::Turn && !w.start_refused => {
                w.start_refused = true;
                Ok(Handled::Applied)
            }
            _ => Ok(Handled::NoOp),
        }
    }

    /// A work reported its end, with an outcome or without one.
    fn work_reported(
        &mut self,
        now: Instant,
        work: WorkId,
        outcome: Option<Outcome>,
    ) -> Result<Handled, Error> {
        self.end_work(now, work, Ended::Reported(outcome))
    }

    fn agent_finished(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        // During the drain the descendants' running turns keep the drain (G9);
        // otherwise finishing winds the subtree down first (G1).
        let wind_down = self.shutdown.as_ref().is_none_or(|s| s.drained);
        let shutting_down = self.shutdown.is_some();
        // The table on `Event`, on the one lookup of the session.
        let s = match answer::admit(
            &mut self.sessions,
            &self.forgotten,
            &self.handed_off,
            id,
            Asks::End,
            shutting_down,
        ) {
            Ok(s) => s,
            Err(answered) => return answered,
        };
        if !s.state.is_active() {
            return Ok(Handled::NoOp);
        }
        let wind_down = wind_down && !s.children.is_empty();
        s.intent = Some(Intent::Finished);
        let busy = !s.works.is_empty();
        let to = if busy {
            State::Cancelling
        } else {
            State::Settled
        };
        // Leave `registered`/`running` before winding the subtree down: the
        // cascade from a child finalized during the wind-down reaches this
        // session, and one still `registered` with a close intent would read
        // as claimed and be finalized mid-transition (G2).
        let cause = Cause::AgentFinished;
        let m = move_state(s, id, to, cause, shutting_down, &mut self.deadlines);
        self.moved(now, id, m);
        if wind_down {
            self.cancel_subtree(now, id, CancelMode::Immediate, EndReason::ParentFinished);
        }
        // Finishing from inside its own turn: the turn is not wanted any more.
        if busy {
            self.cancel_works(now, id, CancelMode::Immediate, false);
        }
        self.cascade(now, id, Cause::AgentFinished);
        Ok(Handled::Applied)
    }

    /// Cancels `id` and winds its subtree down. The table on [`Event`] is
    /// applied here, on the session's one lookup: a finalized session's
    /// cancel is answered as the table says (an internal caller drops the
    /// answer).
    fn cancel(
        &mut self,
        now: Instant,
        id: SessionId,
        mode: CancelMode,
        reason: EndReason,
        cause: Cause,
        descendants: EndReason,
    ) -> Result<Handled, Error> {
        // The table on `Event`, on the one lookup of the session.
        let s = match answer::admit(
            &mut self.sessions,
            &self.forgotten,
            &self.handed_off,
            id,
            Asks::End,
            self.shutdown.is_some(),
        ) {
            Ok(s) => s,
            Err(answered) => return answered,
        };
        // G6: already cancelled, or already ended on its own.
        if !s.state.is_active() {
            return Ok(Handled::NoOp);
        }
        // A close asked of a session a handoff would release is a close:
        // its subtree's wind-down must not release it on the way (SPEC §12).
        if s.intent == Some(Intent::HandOff) {
            s.intent = Some(Intent::End(reason));
        }
        // A graceful cancel is graceful for the whole subtree: each
        // descendant's turn may finish, as the session's own may.
        if !s.children.is_empty() {
            self.cancel_subtree(now, id, mode, descendants);
        }
        self.cancel_one(now, id, mode, reason, cause);
        self.cascade(now, id, cause);
        Ok(Handled::Applied)
    }

    fn cancel_turn(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        if self.cancel_works(now, id, CancelMode::Immediate, true) == 0 {
            return Ok(Handled::NoOp);
        }
        Ok(Handled::Applied)
    }

    fn cancel_work(&mut self, now: Instant, work: WorkId) -> Result<Handled, Error> {
        let settle_at = now.checked_add(self.policy.settle_timeout);
        let Some(w) = self.work_mut(work) else {
            return Ok(Handled::NoOp);
        };
        if w.cancel.is_some() {
            return Ok(Handled::NoOp);
        }
        let mode = CancelMode::Immediate;
        w.cancel = Some(mode);
        if let Some(at) = settle_at {
            w.settle_at = Some(at);
        }
        self.effects.push_back(Effect::CancelWork { work, mode });
        if let Some(at) = settle_at {
            let timer = Timer::Settle(work.kind, work.no);
            self.deadlines.arm(at, work.session, timer);
        }
        Ok(Handled::Applied)
    }

    fn withdraw(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        let Some(s) = self.sessions.get(&id) else {
            return Err(Error::UnknownSession(id));
        };
        let has_child = s.children.iter().any(|c| self.sessions.contains_key(c));
        let pristine = s.state == State::Registered
            && s.turns == s.entry_turns
            && s.tasks == 0
            && !has_child
            && s.intent.is_none();
        if !pristine {
            return Err(wrong_state(
                id,
                s.state,
                "withdraw a registration that was used",
            ));
        }
        let parent = s.parent;
        self.owing -= usize::from(s.room_owed);
        self.sessions.remove(&id);
        self.delegations.remove(&id);
        self.open -= 1;
        let mut parent_may_reclaim = false;
        if let Some(p) = parent.and_then(|p| self.sessions.get_mut(&p)) {
            if let Some(at) = p.children.iter().position(|c| *c == id) {
                p.children.swap_remove(at);
            }
            p.unsettled_children -= 1;
            p.unfinalized_children -= 1;
            parent_may_reclaim = p.unfinalized_children == 0;
        }
        if let (Some(p), true) = (parent, parent_may_reclaim) {
            // Its last child gone, the parent moves as after a child's
            // finalize: a close that waited for its children (a dropped
            // transport, a claim) goes now, or it waits idle again.
            self.after_idle(now, p);
            self.refresh_index(p);
        }
        Ok(Handled::Applied)
    }

    fn cancel_descendants(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        if self.cancel_subtree(now, id, CancelMode::Immediate, EndReason::Cancelled) == 0 {
            return Ok(Handled::NoOp);
        }
        Ok(Handled::Applied)
    }

    /// During a shutdown the shutdown owns the session (G9): a dropped guard
    /// changes nothing. Otherwise it is an immediate cancel.
    fn abandoned(&mut self, now: Instant, id: SessionId) -> Handled {
        if self.shutdown.is_some() {
            return Handled::NoOp;
        }
        let (mode, reason) = (CancelMode::Immediate, EndReason::Cancelled);
        let cause = Cause::CancelRequested(mode);
        self.cancel(now, id, mode, reason, cause, EndReason::Cancelled)
            .unwrap_or(Handled::NoOp)
    }

    fn delegate(&mut self, from: SessionId, to: SessionId) -> Result<Handled, Error> {
        if let Some(answered) = self.answer(to, Asks::Use) {
            return answered;
        }
        if from == to {
            return Ok(Handled::NoOp);
        }
        let delegates = self.delegations.entry(from).or_default();
        if delegates.contains(&to) {
            return Ok(Handled::NoOp);
        }
        delegates.push(to);
        Ok(Handled::Applied)
    }

    fn hold(&mut self, id: SessionId, hold: Hold) -> Result<Handled, Error> {
        let Some(s) = self.sessions.get_mut(&id) else {
            return Err(Error::UnknownSession(id));
        };
        let slot = s.holds.slot(hold);
        *slot = slot.saturating_add(1);
        let holds = s.holds;
        self.effects
            .push_back(Effect::RecordHolds { session: id, holds });
        self.refresh_index(id);
        Ok(Handled::Applied)
    }

    fn release(&mut self, now: Instant, id: SessionId, hold: Hold) -> Result<Handled, Error> {
        let Some(s) = self.sessions.get_mut(&id) else {
            return Err(Error::UnknownSession(id));
        };
        let slot = s.holds.slot(hold);
        if *slot == 0 {
            return Ok(Handled::NoOp);
        }
        *slot -= 1;
        if s.holds.is_empty() && s.works.is_empty() {
            s.idle_since = now;
        }
        let holds = s.holds;
        self.effects
            .push_back(Effect::RecordHolds { session: id, holds });
        self.after_idle(now, id);
        // No transition may have happened: the hold count changed alone.
        self.refresh_index(id);
        Ok(Handled::Applied)
    }

    fn transport_attached(&mut self, id: SessionId, close_on_disconnect: bool) -> Handled {
        let Some(s) = self.sessions.get_mut(&id) else {
            return Handled::NoOp;
        };
        s.transport.attached = s.transport.attached.saturating_add(1);
        s.transport.close_on_disconnect |= close_on_disconnect;
        // A transport is back: it is no orphan, and nothing waits to close it.
        s.orphan_deadline = None;
        s.transport.pending = None;
        Handled::Applied
    }

    fn transport_detached(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        let grace = self.policy.orphan_grace;
        let Some(s) = self.sessions.get_mut(&id) else {
            return Err(Error::UnknownSession(id));
        };
        if s.transport.attached == 0 {
            return Ok(Handled::NoOp);
        }
        s.transport.attached -= 1;
        if s.transport.attached > 0 {
            return Ok(Handled::Applied);
        }
        if s.transport.close_on_disconnect {
            s.transport.pending = Some(EndReason::TransportClosed);
            self.after_idle(now, id);
        } else if let Some(at) = now.checked_add(grace) {
            s.orphan_deadline = Some(at);
            self.deadlines.arm(at, id, Timer::Orphan);
        }
        Ok(Handled::Applied)
    }

    fn sweep(&mut self, now: Instant, sweep: Sweep) -> Handled {
        let before = self.open;
        match sweep {
            Sweep::Idle => self.reap_idle(now),
            Sweep::Lru => self.enforce_lru_cap(now),
            Sweep::Orphan => {
                let mut due: Vec<(Instant, SessionId)> = self
                    .sessions
                    .iter()
                    .filter_map(|(id, s)| s.orphan_deadline.map(|at| (at, id)))
                    .filter(|(at, _)| *at <= now)
                    .collect();
                // The longest orphaned first, as the deadlines would have.
                due.sort_unstable();
                for (_, id) in due {
                    self.orphan_deadline(now, id);
                }
            }
        }
        if self.open < before {
            Handled::Applied
        } else {
            Handled::NoOp
        }
    }

    fn begin_shutdown(&mut self, now: Instant, drain: Duration) -> Handled {
        self.begin(now, drain, false)
    }

    /// Begins a shutdown; with `handoff`, one that releases its sessions
    /// for adoption instead of finalizing them (SPEC §12).
    fn begin(&mut self, now: Instant, drain: Duration, handoff: bool) -> Handled {
        if self.shutdown.is_some() {
            return Handled::NoOp;
        }
        self.shutdown = Some(Shutdown {
            drained: false,
            complete_sent: false,
            summary: ShutdownSummary {
                handoff,
                ..ShutdownSummary::default()
            },
        });
        let intent = match handoff {
            true => Intent::HandOff,
            false => Intent::End(EndReason::Shutdown),
        };
        // No automatic path but the shutdown's own runs from here on.
        self.deadlines.clear_idle(&mut self.sessions);
        self.effects.push_back(Effect::FlushTranscripts);
        let order = open_sessions_bottom_up(&self.sessions);
        for &id in &order {
            let Some(s) = self.sessions.get_mut(&id) else {
                continue;
            };
            s.intent.get_or_insert(intent);
            s.running_at_shutdown = s.state == State::Running && s.works.turn.is_some();
        }
        // Idle sessions go now, children before parents; running turns drain.
        for &id in &order {
            self.settle_or_finalize(now, id, Cause::DescendantsSettled);
        }
        match now.checked_add(drain) {
            _ if drain.is_zero() => self.end_drain(now),
            Some(at) => self.deadlines.drain = Some(at),
            // A drain too long to represent ends only when skipped.
            None => {}
        }
        Handled::Applied
    }

    /// G8: nothing may start any more and every work is cancelled now.
    fn lease_lost(&mut self, now: Instant) -> Handled {
        // Set first: the shutdown finalizes idle sessions as it begins.
        self.lease_lost = true;
        self.begin_shutdown(now, Duration::ZERO);
        self.skip_drain(now);
        if let Some(shutdown) = self.shutdown.as_mut() {
            shutdown.summary.lease_lost = true;
        }
        Handled::Applied
    }

    fn skip_drain(&mut self, now: Instant) -> Handled {
        match &self.shutdown {
            Some(s) if !s.drained => {
                self.end_drain(now);
                Handled::Applied
            }
            _ => Handled::NoOp,
        }
    }

    // ----- deadlines ------------------------------------------------------

    /// G5: the work had its chance to unwind; abandon it.
    fn settle_deadline(
        &mut self,
        now: Instant,
        id: SessionId,
        kind: WorkKind,
        no: u32,
        at: Instant,
    ) {
        let due = self
            .sessions
            .get_mut(&id)
            .and_then(|s| s.works.get_mut(kind, no))
            .filter(|w| w.settle_at == Some(at));
        let Some(w) = due else {
            return;
        };
        let work = w.id(id);
        if w.stream_needs_close() {
            self.effects.push_back(Effect::CloseStream { work });
        }
        self.effects.push_back(Effect::DetachWork { work });
        if let Some(shutdown) = self.shutdown.as_mut() {
            shutdown.summary.detached.push(work);
        }
        let _ = self.end_work(now, work, Ended::Detached);
    }

    fn orphan_deadline(&mut self, now: Instant, id: SessionId) {
        let grace = self.policy.orphan_grace;
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        s.orphan_deadline = None;
        if s.transport.attached > 0 || !s.state.is_open() || s.intent.is_some() {
            return;
        }
        if !self.claim(now, id, EndReason::OrphanReap) {
            // Skipped because a work (or a hold) is live: try again later
            // (SPEC §5). With no grace at all, "later" is the moment it is
            // idle: a deadline re-armed at `now` would fire again at once.
            let Some(s) = self.sessions.get_mut(&id) else {
                return;
            };
            if grace.is_zero() {
                s.transport.pending = Some(EndReason::OrphanReap);
            } else if let Some(at) = now.checked_add(grace) {
                s.orphan_deadline = Some(at);
                self.deadlines.arm(at, id, Timer::Orphan);
            }
        }
    }

    fn reap_idle(&mut self, now: Instant) {
        let Some(ttl) = self.policy.idle_ttl else {
            return;
        };
        while let Some((since, id)) = self.deadlines.next_idle(&mut self.sessions) {
            if since.checked_add(ttl).is_none_or(|at| at > now) {
                break;
            }
            self.take_idle(id);
            self.claim(now, id, EndReason::IdleReap);
        }
    }

    fn enforce_lru_cap(&mut self, now: Instant) {
        let Some(cap) = self.policy.lru_cap else {
            return;
        };
        while self.open > cap {
            let Some((_, id)) = self.deadlines.next_idle(&mut self.sessions) else {
                break;
            };
            self.take_idle(id);
            self.claim(now, id, EndReason::LruEvict);
        }
    }

    fn end_drain(&mut self, now: Instant) {
        let Some(shutdown) = self.shutdown.as_mut() else {
            return;
        };
        shutdown.drained = true;
        self.deadlines.drain = None;
        let order = open_sessions_bottom_up(&self.sessions);
        for &id in &order {
            if self.state(id) == Some(State::Running) {
                if let Some(shutdown) = self.shutdown.as_mut() {
                    shutdown.summary.cancelled.push(id);
                }
                let mode = CancelMode::Immediate;
                if self.hands_off(id) {
                    // Its turn is cancelled and settled; the session stays
                    // open, to be released once it is idle (SPEC §12).
                    self.cancel_works(now, id, mode, false);
                } else {
                    self.cancel_one(now, id, mode, EndReason::Shutdown, Cause::DrainEnded);
                }
            }
        }
        // Held sessions were spared until now; nothing is spared any more.
        for &id in &order {
            self.settle_or_finalize(now, id, Cause::DescendantsSettled);
        }
    }

    fn set_budget(
        &mut self,
        now: Instant,
        id: SessionId,
        budget: Budget,
    ) -> Result<Handled, Error> {
        let Some(s) = self.sessions.get_mut(&id) else {
            return Err(Error::UnknownSession(id));
        };
        // A subtree winding down (its budget spent, among others) is not
        // given a new one.
        if let Some(intent) = s.intent {
            return Err(Error::Closing {
                session: id,
                reason: intent.reason(s.last_outcome),
            });
        }
        if !s.state.is_active() {
            return Err(wrong_state(id, s.state, "set a budget"));
        }
        let spent = Spent::new(budget, now);
        if let Some(at) = spent.deadline {
            self.deadlines.arm(at, id, Timer::Budget);
        }
        s.budget = Some(Box::new(spent));
        s.budgeted = true;
        // Its subtree counts against it from now on.
        let mut below = s.children.clone();
        while let Some(child) = below.pop() {
            if let Some(c) = self.sessions.get_mut(&child) {
                c.budgeted = true;
                below.extend(c.children.iter().copied());
            }
        }
        Ok(Handled::Applied)
    }

    fn usage(&mut self, now: Instant, work: WorkId, tokens: u64) -> Handled {
        if !self.sessions.get(&work.session).is_some_and(|s| s.budgeted) {
            return Handled::Applied;
        }
        self.spend(work.session, |spent| {
            spent.tokens = spent.tokens.saturating_add(tokens);
        });
        // Top down: the widest budget that ran out winds its subtree down;
        // one under it is then wound down with it.
        for owner in self.budget_owners(work.session).into_iter().rev() {
            let exceeded = self
                .sessions
                .get(&owner)
                .and_then(|s| s.budget.as_ref())
                .is_some_and(|b| b.tokens_spent() && !b.exhausted);
            if exceeded {
                self.exhaust(now, owner, BudgetLimit::Tokens);
            }
        }
        Handled::Applied
    }

    /// The sessions from `id` up to its root that have a budget, nearest first.
    fn budget_owners(&self, id: SessionId) -> Vec<SessionId> {
        let mut owners = Vec::new();
        let mut at = Some(id);
        while let Some(s) = at.and_then(|a| self.sessions.get(&a).map(|s| (a, s))) {
            if s.1.budget.is_some() {
                owners.push(s.0);
            }
            at = s.1.parent;
        }
        owners
    }

    /// The widest budget over `id` with no turn left, if any.
    fn turns_spent(&self, id: SessionId) -> Option<SessionId> {
        self.budget_owners(id).into_iter().rev().find(|owner| {
            self.sessions
                .get(owner)
                .and_then(|s| s.budget.as_ref())
                .is_some_and(|b| b.turns_spent())
        })
    }

    /// Counts something spent in `id` against every budget over it.
    fn spend(&mut self, id: SessionId, mut what: impl FnMut(&mut Spent)) {
        for owner in self.budget_owners(id) {
            if let Some(spent) = self
                .sessions
                .get_mut(&owner)
                .and_then(|s| s.budget.as_mut())
            {
                what(spent);
            }
        }
    }

    /// `id`'s budget ran out of `limit`: its subtree is cancelled, deepest
    /// first (G1), and every session of it finalized `budget_exhausted`.
    fn exhaust(&mut self, now: Instant, id: SessionId, limit: BudgetLimit) {
        if let Some(spent) = self.sessions.get_mut(&id).and_then(|s| s.budget.as_mut()) {
            spent.exhausted = true;
        }
        let (mode, reason) = (CancelMode::Immediate, EndReason::BudgetExhausted);
        let cause = Cause::BudgetExhausted(limit);
        let _ = self.cancel(now, id, mode, reason, cause, reason);
    }

    // ----- the shared mechanisms ------------------------------------------

    /// The claim of every automatic reclaim path: the predicate is evaluated
    /// here, in the same step that marks the session closing (G3).
    fn claim(&mut self, now: Instant, id: SessionId, reason: EndReason) -> bool {
        let shutting_down = self.shutdown.is_some();
        let Some(s) = self.sessions.get_mut(&id) else {
            return false;
        };
        if shutting_down || !s.is_reclaimable() {
            return false;
        }
        s.intent = Some(Intent::End(reason));
        self.cascade(now, id, Cause::DescendantsSettled);
        true
    }

    /// Cancels every open descendant of `id`, deepest first, in `mode` (a
    /// graceful cancel lets each descendant's turn finish, as the session's
    /// own; a finishing agent's wind-down and a descendants' cancel are
    /// immediate); returns how many.
    ///
    /// A subtree's cancel is two orders, not two per session: every
    /// session's move to `cancelling` (or `settled`) is gathered into one
    /// [`Effect::Transitions`] and every work's cancel into one
    /// [`Effect::CancelWorks`], descendants first. Only then does each
    /// cancelled session settle and finalize as far as it may (children
    /// before parents, G1): what those cascades order comes after the two
    /// sets, so a session's cancel is still ordered before its end.
    fn cancel_subtree(
        &mut self,
        now: Instant,
        id: SessionId,
        mode: CancelMode,
        reason: EndReason,
    ) -> usize {
        let order = open_descendants_bottom_up(&self.sessions, id);
        // A subtree wound down is closed, not handed off on the way: a
        // child's finalize must not release a descendant above it (SPEC §12).
        for d in &order {
            if let Some(s) = self.sessions.get_mut(d) {
                if s.intent == Some(Intent::HandOff) {
                    s.intent = Some(Intent::End(reason));
                }
            }
        }
        let cause = Cause::AncestorWindingDown;
        self.gathering = Some(Box::new(Gathered {
            at: now,
            cause,
            mode,
            moves: Vec::with_capacity(order.len()),
            works: Vec::with_capacity(order.len()),
        }));
        let mut cancelled = Vec::with_capacity(order.len());
        for &d in &order {
            if self.state(d).is_some_and(State::is_active) {
                self.cancel_one(now, d, mode, reason, cause);
                cancelled.push(d);
            }
        }
        if let Some(gathered) = self.gathering.take() {
            let Gathered {
                at,
                cause,
                mode,
                moves,
                works,
            } = *gathered;
            if !moves.is_empty() {
                let set = Transitions { at, cause, moves };
                self.effects.push_back(Effect::Transitions(Box::new(set)));
            }
            if !works.is_empty() {
                self.effects.push_back(Effect::CancelWorks { works, mode });
            }
        }
        for &d in &cancelled {
            // A session whose works still run cannot move yet, nor can a
            // parent because of it (it is as open as it was).
            if self.sessions.get(&d).is_some_and(|s| !s.works.is_empty()) {
                continue;
            }
            self.cascade(now, d, cause);
        }
        cancelled.len()
    }

    /// Cancels one registered or running session (its descendants are the
    /// caller's business): cancel each of its works once (G6) and move it to
    /// `cancelling`, or straight to `settled` when nothing of it is live.
    fn cancel_one(
        &mut self,
        now: Instant,
        id: SessionId,
        mode: CancelMode,
        reason: EndReason,
        cause: Cause,
    ) {
        let shutting_down = self.shutdown.is_some();
        let Some(s) = self.sessions.get_mut(&id).filter(|s| s.state.is_active()) else {
            return;
        };
        // The first decision says what happened; a shutdown finalizes
        // everything `shutdown` anyway.
        s.intent.get_or_insert(Intent::End(reason));
        let to = if s.works.is_empty() && s.unsettled_children == 0 {
            State::Settled
        } else {
            State::Cancelling
        };
        let busy = !s.works.is_empty();
        let m = move_state(s, id, to, cause, shutting_down, &mut self.deadlines);
        self.moved(now, id, m);
        if busy {
            self.cancel_works(now, id, mode, false);
        }
    }

    /// Sends each live work of `id` (only its turn, with `turn_only`) its one
    /// cancel (G6) and arms each work's settle deadline (G5). The work closes
    /// its own stream when its token is cancelled; the core orders a close from
    /// outside only where the work may not (the attach race, a detach). Returns how many works it cancelled.
    fn cancel_works(
        &mut self,
        now: Instant,
        id: SessionId,
        mode: CancelMode,
        turn_only: bool,
    ) -> usize {
        let settle_at = now.checked_add(self.policy.settle_timeout);
        let Some(s) = self.sessions.get_mut(&id) else {
            return 0;
        };
        let mut cancelled = 0;
        for w in s.works.iter_mut() {
            if w.cancel.is_some() || (turn_only && w.kind != WorkKind::Turn) {
                continue;
            }
            let work = w.id(id);
            w.cancel = Some(mode);
            match self.gathering.as_mut().filter(|g| g.mode == mode) {
                Some(gathered) => gathered.works.push(work),
                None => self.effects.push_back(Effect::CancelWork { work, mode }),
            }
            // A settle timeout too long to represent never detaches.
            if let Some(at) = settle_at {
                w.settle_at = Some(at);
                self.deadlines.arm(at, id, Timer::Settle(w.kind, w.no));
            }
            cancelled += 1;
        }
        cancelled
    }

    /// A work is over (it reported, or it was detached): take it from its
    /// session, order its end, and move the session on. A work that is not
    /// the session's any more (detached, long over) is a no-op.
    fn end_work(&mut self, now: Instant, work: WorkId, how: Ended) -> Result<Handled, Error> {
        let id = work.session;
        let shutting_down = self.shutdown.is_some();
        // The table on `Event`, on the one lookup of the session.
        let s = match answer::admit(
            &mut self.sessions,
            &self.forgotten,
            &self.handed_off,
            id,
            Asks::Report,
            shutting_down,
        ) {
            Ok(s) => s,
            Err(answered) => return answered,
        };
        let Some(w) = s.works.take(work.kind, work.no) else {
            // A late report from a detached (or long gone) work: its session
            // moved on without it.
            return Ok(Handled::NoOp);
        };
        let (outcome, cause) = match how {
            Ended::Detached => (Outcome::Detached, Cause::SettleDeadline),
            Ended::Reported(outcome) => {
                let outcome = outcome.unwrap_or(if w.cancel.is_some() {
                    Outcome::Cancelled
                } else {
                    Outcome::Failed
                });
                // A turn that was running when the shutdown began and ended
                // on its own within the drain was drained (G9).
                if let Some(shutdown) = self.shutdown.as_mut() {
                    let was_running =
                        work.kind == WorkKind::Turn && std::mem::take(&mut s.running_at_shutdown);
                    if was_running && !shutdown.drained && w.cancel.is_none() {
                        shutdown.summary.drained.push(id);
                    }
                }
                match work.kind {
                    WorkKind::Turn => (outcome, Cause::TurnEnded(outcome)),
                    WorkKind::Task => (outcome, Cause::TaskEnded(outcome)),
                }
            }
        };
        self.effects.push_back(Effect::EndWork { work, outcome });
        match s.work_ended(work.kind, outcome, now) {
            Left::Busy => {}
            Left::Idle { closing } => {
                let to = State::Registered;
                let m = move_state(s, id, to, cause, shutting_down, &mut self.deadlines);
                self.moved(now, id, m);
                if closing {
                    self.after_idle(now, id);
                }
            }
            Left::WindingDown => self.cascade(now, id, cause),
        }
        Ok(Handled::Applied)
    }

    /// After a session became idle, or a hold or transport changed: a claim
    /// that waited for it to be idle, or a closing session's finalize.
    /// Nothing above it changes unless it moves, so the walk up starts only
    /// then.
    fn after_idle(&mut self, now: Instant, id: SessionId) {
        let cause = Cause::DescendantsSettled;
        if let (true, Some(parent)) = self.settle_or_finalize(now, id, cause) {
            self.cascade(now, parent, cause);
        }
    }

    /// Settles and finalizes `id` if it may be, then walks up: each ancestor
    /// that becomes settled or finalized lets its own parent move (G1).
    fn cascade(&mut self, now: Instant, id: SessionId, cause: Cause) {
        let mut node = Some(id);
        let mut cause = cause;
        // The caller may already have moved `id`, so its parent is always looked at.
        let mut look_at_parent = true;
        while let Some(current) = node {
            let (changed, parent) = self.settle_or_finalize(now, current, cause);
            if !changed && !look_at_parent {
                break;
            }
            look_at_parent = false;
            node = parent;
            cause = Cause::DescendantsSettled;
        }
    }

    /// Settles and finalizes `id` if it may be. Returns whether it moved,
    /// and its parent, for the walk up.
    fn settle_or_finalize(
        &mut self,
        now: Instant,
        id: SessionId,
        cause: Cause,
    ) -> (bool, Option<SessionId>) {
        let drained = self.is_drained();
        let shutting_down = self.shutdown.is_some();
        let lease_lost = self.lease_lost;
        let Some(s) = self.sessions.get_mut(&id) else {
            return (false, None);
        };
        let parent = s.parent;
        // A reclaim that found it busy (a work, a hold, a child) goes the
        // moment it is reclaimable, which may be a child's finalize walking
        // up here (G3: predicate and mark in one step, as in `claim`).
        let pending = s
            .transport
            .pending
            .filter(|_| s.transport.attached == 0 && s.is_reclaimable() && !shutting_down);
        if let Some(reason) = pending {
            s.transport.pending = None;
            s.intent = Some(Intent::End(reason));
        }
        // Decided from one lookup: most calls find nothing to do.
        let idle = s.works.is_empty();
        let settle = s.state == State::Cancelling && idle && s.unsettled_children == 0;
        let state = if settle { State::Settled } else { s.state };
        let finalize = match (state, s.intent) {
            _ if !idle || s.unfinalized_children > 0 => None,
            (State::Settled, Some(intent)) => Some(intent),
            // A claimed idle session, or one closed by shutdown; a held one
            // waits for the end of the drain, unless it is handed off: its
            // holds go with it.
            (State::Registered, Some(intent))
                if s.holds.is_empty() || drained || (intent == Intent::HandOff && !lease_lost) =>
            {
                Some(intent)
            }
            _ => None,
        };
        let last_outcome = s.last_outcome;
        let outcome = last_outcome.or(s.last_task_outcome);
        // A handoff releases an idle session instead, unless the lease is
        // lost: it is then no longer this process's to release (G8).
        if finalize == Some(Intent::HandOff) && state == State::Registered && !self.lease_lost {
            self.hand_off(id);
            return (true, parent);
        }
        // Every session finalized after a shutdown began ends `shutdown`
        // (G9), or, once the lease is lost, `recovered`: this process may
        // not write it any more, and recovery ends it so (G8), so that is
        // what its clients are told.
        let lease_lost = self.lease_lost;
        let reason = finalize.map(|intent| match (lease_lost, shutting_down) {
            (true, _) => EndReason::Recovered,
            (false, true) => EndReason::Shutdown,
            (false, false) => intent.reason(last_outcome),
        });
        let deadlines = &mut self.deadlines;
        let settled =
            settle.then(|| move_state(s, id, State::Settled, cause, shutting_down, deadlines));
        let finalized = reason.map(|reason| {
            let cause = Cause::Finalized(reason);
            move_state(s, id, State::Finalized, cause, shutting_down, deadlines)
        });
        let had_slot = finalized.is_some() && std::mem::take(&mut s.has_slot);
        let held = !s.holds.is_empty();
        if let Some(m) = settled {
            self.moved(now, id, m);
        }
        if let (Some(m), Some(reason)) = (finalized, reason) {
            // What was kept for an adopter goes with the session: a
            // finalized one has none (SPEC §5), so the store keeps nothing.
            if held {
                self.effects.push_back(Effect::RecordHolds {
                    session: id,
                    holds: crate::Holds::default(),
                });
            }
            self.moved(now, id, m);
            // The latch is spent (G2): emitted once, the state is terminal.
            self.effects.push_back(Effect::Finalize(Finalize {
                session: id,
                reason,
                last_outcome,
                outcome,
                commit_memory: last_outcome == Some(Outcome::Completed),
                in_shutdown: shutting_down,
            }));
            // The rest of the plan that is the core's: its slot is free
            // (step 5), its delegations are interrupted (step 6) once this
            // input's cascade is over.
            if had_slot {
                self.slots_taken -= 1;
            }
            let delegates = match self.delegations.is_empty() {
                true => None,
                false => self.delegations.remove(&id),
            };
            if let Some(delegates) = delegates {
                // Not its own ancestors: their lifetime holds its own, and a
                // subtree's wind-down never cancels whoever asked for it (G1).
                let sessions = &self.sessions;
                let ancestor = |d: SessionId| {
                    let mut at = parent;
                    while let Some(p) = at {
                        if p == d {
                            return true;
                        }
                        at = sessions.get(&p).and_then(|s| s.parent);
                    }
                    false
                };
                let interrupted = delegates.into_iter().filter(|d| !ancestor(*d));
                self.interrupts.extend(interrupted);
            }
        }
        (settled.is_some() || finalized.is_some(), parent)
    }

    /// SPEC §4 step 6 for the sessions the current input finalized: each
    /// session they delegated to is cancelled, which may finalize more.
    #[inline]
    fn interrupt_delegations(&mut self, now: Instant) {
        // During a shutdown's drain the shutdown owns every session (G9): a
        // delegate's running work keeps the drain and is cut at its end,
        // and every session ends `shutdown` whatever else would end it.
        if self.shutdown.as_ref().is_some_and(|s| !s.drained) {
            self.interrupts.clear();
            return;
        }
        while !self.interrupts.is_empty() {
            for id in std::mem::take(&mut self.interrupts) {
                let mode = CancelMode::Immediate;
                let cause = Cause::DelegationInterrupted;
                if self.sessions.contains_key(&id) {
                    let reason = EndReason::Cancelled;
                    let _ = self.cancel(now, id, mode, reason, cause, reason);
                }
            }
        }
    }

    /// The second half of every transition ([`move_state`] is the first),
    /// once the session's record is released: the parent's counts, the open
    /// count, the timeline, the parent's index.
    fn moved(&mut self, now: Instant, id: SessionId, m: Moved) {
        let Moved {
            from,
            to,
            cause,
            parent,
            owed,
        } = m;
        let mut parent_may_reclaim = false;
        if let Some(p) = parent.and_then(|p| self.sessions.get_mut(&p)) {
            if from.is_open() && !to.is_open() {
                p.unsettled_children -= 1;
            }
            if to == State::Finalized {
                p.unfinalized_children -= 1;
                parent_may_reclaim = p.unfinalized_children == 0;
            }
        }
        if to == State::Finalized {
            self.open -= 1;
            self.owing -= usize::from(owed);
        }
        self.record(now, id, Some(from), to, cause);
        if let (Some(p), true) = (parent, parent_may_reclaim) {
            // Its last child is gone: it may be reclaimable now (G1).
            self.refresh_index(p);
        }
    }

    fn record(
        &mut self,
        at: Instant,
        session: SessionId,
        from: Option<State>,
        to: State,
        cause: Cause,
    ) {
        let gathered = self
            .gathering
            .as_mut()
            .filter(|g| g.at == at && g.cause == cause);
        if let (Some(gathered), Some(from)) = (gathered, from) {
            gathered.moves.push(Move { session, from, to });
            return;
        }
        self.effects.push_back(Effect::Transition(Transition {
            session,
            at,
            from,
            to,
            cause,
        }));
    }

    /// Takes `id`, the oldest idle session, out of the idle index to claim it.
    fn take_idle(&mut self, id: SessionId) {
        if let Some(s) = self.sessions.get_mut(&id) {
            self.deadlines.take_next_idle(&mut s.idle);
        }
    }

    /// Puts `id` in the idle index exactly when it is reclaimable.
    fn refresh_index(&mut self, id: SessionId) {
        let shutting_down = self.shutdown.is_some();
        if let Some(s) = self.sessions.get_mut(&id) {
            index(s, id, shutting_down, &mut self.deadlines);
        }
    }

    /// Drops stale entries from the top of the deadline table, so that
    /// [`poll_timeout`](Self::poll_timeout) names a deadline someone waits for.
    fn prune_stale(&mut self) {
        let sessions = &self.sessions;
        self.deadlines.prune(|at, id, timer| {
            sessions.get(&id).is_some_and(|s| match timer {
                Timer::Settle(kind, no) => s
                    .works
                    .iter()
                    .any(|w| w.kind == kind && w.no == no && w.settle_at == Some(at)),
                Timer::Orphan => s.orphan_deadline == Some(at),
                Timer::Budget => {
                    s.state.is_active()
                        && s.budget
                            .as_ref()
                            .is_some_and(|b| b.deadline == Some(at) && !b.exhausted)
                }
            })
        });
        self.deadlines.next_idle(&mut self.sessions);
    }

    /// After every input: announce the end of a shutdown once. Stale entries on
    /// top of the deadline table are left for `handle_timeout` to drop: at
    /// worst they cost the driver one spurious wake, which is a no-op.
    #[inline]
    fn after_input(&mut self) {
        if self.shutdown.is_some() {
            self.announce_shutdown_complete();
        }
    }

    /// Once a shutdown has finalized or handed off every session: its
    /// summary, once.
    fn announce_shutdown_complete(&mut self) {
        if let Some(shutdown) = self.shutdown.as_mut() {
            if self.open == 0 && !shutdown.complete_sent {
                shutdown.complete_sent = true;
                let summary = std::mem::take(&mut shutdown.summary);
                self.effects
                    .push_back(Effect::ShutdownComplete(Box::new(summary)));
            }
        }
    }

    fn clock(&mut self, now: Instant) -> Instant {
        let now = self.now.map_or(now, |seen| seen.max(now));
        self.now = Some(now);
        now
    }

    /// What the core knows of `id`.
    fn find(&self, id: SessionId) -> Found<'_> {
        match self.sessions.get(&id) {
            Some(s) => Found::Kept(s),
            None if self.forgotten.contains(id) => Found::Forgotten,
            None if self.handed_off.contains_key(&id) => Found::HandedOff,
            None => Found::Unknown,
        }
    }

    /// The answer table's word on an input that `asks` this of `id`, if it
    /// decides it (see [`answer::answer`]).
    #[inline]
    fn answer(&self, id: SessionId, asks: Asks) -> Option<Result<Handled, Error>> {
        answer::answer(id, asks, self.find(id), self.shutdown.is_some())
    }

    fn work_mut(&mut self, work: WorkId) -> Option<&mut Work> {
        self.sessions
            .get_mut(&work.session)?
            .works
            .get_mut(work.kind, work.no)
    }

    /// How many entries the deadline table holds (stale ones included); for tests.
    #[doc(hidden)]
    pub fn deadline_entries(&self) -> usize {
        self.deadlines.len()
    }

    /// How many entries the list of `id`'s children holds (forgotten ones
    /// included until they are compacted away); for tests.
    #[doc(hidden)]
    pub fn child_entries(&self, id: SessionId) -> usize {
        self.sessions.get(&id).map_or(0, |s| s.children.len())
    }

    /// How many entries the idle index holds (stale ones included); for tests.
    #[doc(hidden)]
    pub fn idle_entries(&self) -> usize {
        self.deadlines.idle_len()
    }
}

/// How a work's end came to the core.
#[derive(Debug, Clone, Copy)]
enum Ended {
    /// The work reported it, with an outcome or without one.
    Reported(Option<Outcome>),
    /// Its settle deadline passed (G5).
    Detached,
}

/// A state change made on a session's record, for [`Core::moved`] to finish.
#[derive(Debug, Clone, Copy)]
struct Moved {
    from: State,
    to: State,
    cause: Cause,
    parent: Option<SessionId>,
    /// Finalized while its registration at the cap waited for its commit.
    owed: bool,
}

/// The first half of every transition, on the session's record `s` (of id
/// `id`): the one place a state changes, checked against the one transition
/// table, [`State::can_move_to`].
fn move_state(
    s: &mut Session,
    id: SessionId,
    to: State,
    cause: Cause,
    shutting_down: bool,
    deadlines: &mut Deadlines,
) -> Moved {
    let from = s.state;
    debug_assert!(
        from.can_move_to(to),
        "session {id}: {from} -> {to} ({cause})"
    );
    s.state = to;
    let mut owed = false;
    if to == State::Finalized {
        // Nothing waits on it any more.
        s.orphan_deadline = None;
        s.children.shrink_to_fit();
        owed = std::mem::take(&mut s.room_owed);
    }
    index(s, id, shutting_down, deadlines);
    Moved {
        from,
        to,
        cause,
        parent: s.parent,
        owed,
    }
}

/// Puts the session `s` (of id `id`) in the idle index exactly when it is
/// reclaimable.
fn index(s: &mut Session, id: SessionId, shutting_down: bool, deadlines: &mut Deadlines) {
    let since = (!shutting_down && s.is_reclaimable()).then_some(s.idle_since);
    deadlines.set_idle(&mut s.idle, id, since);
}

fn wrong_state(session: SessionId, state: State, action: &'static str) -> Error {
    Error::WrongState {
        session,
        state,
        action,
    }
}
