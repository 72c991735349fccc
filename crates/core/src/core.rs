//! The lifecycle state machine. Every transition of SPEC §2 is in this file.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::deadlines::{Deadlines, Timer};
use crate::hash::SessionMap;
use crate::session::{Session, SessionView, Work};
use crate::tree::{open_descendants_bottom_up, open_sessions_bottom_up};
use crate::{
    CancelMode, Cause, EndReason, Error, Event, Finalize, Handled, Hold, Outcome, Policy,
    SessionId, State, Sweep, Transition,
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
    sessions: SessionMap<Session>,
    effects: VecDeque<crate::Effect>,
    deadlines: Deadlines,
    /// Sessions not yet finalized.
    open: usize,
    shutdown: Option<Shutdown>,
    /// The latest `now` seen: time never runs backwards inside the core.
    now: Option<Instant>,
}

#[derive(Debug, Clone, Copy)]
struct Shutdown {
    drained: bool,
    complete_sent: bool,
}

impl Core {
    /// A core with no sessions.
    pub fn new(policy: Policy) -> Self {
        Core {
            policy,
            sessions: SessionMap::default(),
            effects: VecDeque::new(),
            deadlines: Deadlines::default(),
            open: 0,
            shutdown: None,
            now: None,
        }
    }

    /// The policy it was built with.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Feeds one input. On `Err` nothing changed and no effect was queued.
    pub fn handle(&mut self, now: Instant, event: Event) -> Result<Handled, Error> {
        let now = self.clock(now);
        let handled = match event {
            Event::Register { session, parent } => self.register(now, session, parent),
            Event::StartTurn { session } => self.start_turn(now, session),
            Event::StreamAttached { session } => self.stream_attached(now, session),
            Event::StreamClosed { session } => self.stream_closed(now, session),
            Event::TurnEnded { session, outcome } => self.work_ended(now, session, Some(outcome)),
            Event::WorkExited { session } => self.work_ended(now, session, None),
            Event::AgentFinished { session } => self.agent_finished(now, session),
            Event::Cancel { session, mode } => {
                let cause = Cause::CancelRequested(mode);
                self.cancel(now, session, mode, EndReason::Cancelled, cause)
            }
            Event::CancelTurn { session } => self.cancel_turn(now, session),
            Event::CancelDescendants { session } => self.cancel_descendants(now, session),
            Event::UserClose { session } => {
                let (mode, cause) = (CancelMode::Immediate, Cause::UserClose);
                self.cancel(now, session, mode, EndReason::UserClose, cause)
            }
            Event::Hold { session, hold } => self.hold(now, session, hold, true),
            Event::Release { session, hold } => self.hold(now, session, hold, false),
            Event::TransportAttached {
                session,
                close_on_disconnect,
            } => self.transport_attached(now, session, close_on_disconnect),
            Event::TransportDetached { session } => self.transport_detached(now, session),
            Event::Sweep(sweep) => Ok(self.sweep(now, sweep)),
            Event::BeginShutdown { drain } => Ok(self.begin_shutdown(now, drain)),
            Event::SkipDrain => Ok(self.skip_drain(now)),
        };
        self.settle_bookkeeping();
        handled
    }

    /// Processes every deadline due at `now`: settle deadlines (detach, G5),
    /// the drain deadline, orphan grace and idle TTL. Pass the current time,
    /// not the deadline that woke you. Spurious calls are harmless no-ops.
    pub fn handle_timeout(&mut self, now: Instant) {
        let now = self.clock(now);
        self.prune_stale();
        if self.deadlines.drain.is_some_and(|at| at <= now) {
            self.end_drain(now);
        }
        while let Some((at, id, timer)) = self.deadlines.pop_due(now) {
            let Some(s) = self.sessions.get(&id) else {
                continue;
            };
            match timer {
                Timer::Settle if s.settle_deadline == Some(at) => self.settle_deadline(now, id),
                Timer::Orphan if s.orphan_deadline == Some(at) => self.orphan_deadline(now, id),
                _ => {}
            }
        }
        self.reap_idle(now);
        self.prune_stale();
        self.settle_bookkeeping();
    }

    /// Drops stale entries from the top of the deadline table, so that
    /// [`poll_timeout`](Self::poll_timeout) names a deadline someone waits for.
    fn prune_stale(&mut self) {
        let sessions = &self.sessions;
        self.deadlines.prune(|at, id, timer| {
            sessions.get(&id).is_some_and(|s| match timer {
                Timer::Settle => s.settle_deadline == Some(at),
                Timer::Orphan => s.orphan_deadline == Some(at),
            })
        });
        self.oldest_idle();
    }

    /// The next effect to execute, in order. Drain until `None` after every input.
    pub fn poll_effect(&mut self) -> Option<crate::Effect> {
        self.effects.pop_front()
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) next, if ever.
    /// Call again after every input: deadlines move. It may name a deadline
    /// that was cancelled since (a work that exited before its settle
    /// deadline); the wake is then a harmless no-op.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadlines.next(self.policy.idle_ttl)
    }

    /// Whether a session could be registered under `parent` right now, without
    /// registering it. A driver that must create a durable row before it can
    /// name the session checks here first, so a refused registration writes nothing.
    pub fn check_register(&self, parent: Option<SessionId>) -> Result<(), Error> {
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        let Some(parent) = parent else { return Ok(()) };
        let p = self
            .sessions
            .get(&parent)
            .ok_or(Error::UnknownSession(parent))?;
        if !matches!(p.state, State::Registered | State::Running) || p.closing.is_some() {
            return Err(Error::ParentNotLive {
                parent,
                state: p.state,
                closing: p.closing.is_some(),
            });
        }
        Ok(())
    }

    /// A view of one session, finalized ones included until [`forget`](Self::forget).
    pub fn session(&self, id: SessionId) -> Option<SessionView<'_>> {
        self.sessions
            .get(&id)
            .map(|inner| SessionView { id, inner })
    }

    /// Every known session, in no particular order.
    pub fn sessions(&self) -> impl Iterator<Item = SessionView<'_>> {
        self.sessions
            .iter()
            .map(|(id, inner)| SessionView { id: *id, inner })
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
        self.shutdown.is_some_and(|s| s.drained)
    }

    /// Drops the record of a finalized session, so a long-lived process does
    /// not keep one per session it ever ran. Returns whether it was dropped;
    /// sessions that are not finalized are kept. Events for a forgotten id
    /// report [`Error::UnknownSession`].
    pub fn forget(&mut self, id: SessionId) -> bool {
        if self.sessions.get(&id).map(|s| s.state) != Some(State::Finalized) {
            return false;
        }
        if let Some(s) = self.sessions.remove(&id) {
            if let Some(p) = s.parent.and_then(|p| self.sessions.get_mut(&p)) {
                p.children.retain(|c| *c != id);
            }
        }
        true
    }

    // ----- inputs ---------------------------------------------------------

    fn register(
        &mut self,
        now: Instant,
        id: SessionId,
        parent: Option<SessionId>,
    ) -> Result<Handled, Error> {
        if self.sessions.contains_key(&id) {
            return Err(Error::DuplicateSession(id));
        }
        self.check_register(parent)?;
        if let Some(p) = parent.and_then(|p| self.sessions.get_mut(&p)) {
            p.children.push(id);
            p.unsettled_children += 1;
            p.unfinalized_children += 1;
        }
        self.sessions.insert(id, Session::new(parent, now));
        self.open += 1;
        self.record(now, id, None, State::Registered, Cause::Registered);
        self.refresh_index(id);
        if let Some(p) = parent {
            self.refresh_index(p);
        }
        self.enforce_lru_cap(now);
        Ok(Handled::Applied)
    }

    fn start_turn(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        let s = self.open_session(id)?;
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        if let Some(reason) = s.closing {
            return Err(Error::Closing {
                session: id,
                reason,
            });
        }
        if s.state != State::Registered {
            return Err(wrong_state(id, s.state, "start a turn"));
        }
        let s = self.session_mut(now, id);
        s.turns += 1;
        s.work = Some(Work::new(s.turns));
        self.transition(now, id, State::Running, Cause::TurnStarted);
        Ok(Handled::Applied)
    }

    fn stream_attached(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        self.open_session(id)?;
        let s = self.session_mut(now, id);
        let Some(work) = s.work.as_mut() else {
            return Ok(Handled::NoOp);
        };
        work.stream_attached = true;
        // The attach race of seed 001: the cancel landed before the stream was
        // attached, so the work may never see it; close the stream from here.
        if work.cancel == Some(CancelMode::Immediate) && work.stream_needs_close() {
            work.close_sent = true;
            let work = work.id(id);
            self.effects.push_back(crate::Effect::CloseStream { work });
        }
        Ok(Handled::Applied)
    }

    fn stream_closed(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        self.open_session(id)?;
        match self.session_mut(now, id).work.as_mut() {
            Some(work) if !work.stream_closed => {
                work.stream_closed = true;
                Ok(Handled::Applied)
            }
            _ => Ok(Handled::NoOp),
        }
    }

    /// The turn's work is gone: it reported an outcome, or just exited.
    fn work_ended(
        &mut self,
        now: Instant,
        id: SessionId,
        outcome: Option<Outcome>,
    ) -> Result<Handled, Error> {
        self.open_session(id)?;
        let s = self.session_mut(now, id);
        let Some(work) = s.work.take() else {
            // A detached work reporting late: its session moved on without it.
            return Ok(Handled::NoOp);
        };
        let outcome = outcome.unwrap_or(if work.cancel.is_some() {
            Outcome::Cancelled
        } else {
            Outcome::Failed
        });
        s.last_outcome = Some(outcome);
        s.settle_deadline = None;
        match s.state {
            State::Running => {
                s.idle_since = now;
                self.transition(now, id, State::Registered, Cause::TurnEnded(outcome));
                self.after_turn(now, id);
            }
            _ => self.cascade(now, id, Cause::TurnEnded(outcome)),
        }
        Ok(Handled::Applied)
    }

    fn agent_finished(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        let s = self.open_session(id)?;
        if !matches!(s.state, State::Registered | State::Running) {
            return Ok(Handled::NoOp);
        }
        let s = self.session_mut(now, id);
        if let Some(work) = s.work.take() {
            // Finished from inside its own turn: that turn is over.
            s.last_outcome = Some(Outcome::Completed);
            s.settle_deadline = None;
            if work.stream_needs_close() {
                let work = work.id(id);
                self.effects.push_back(crate::Effect::CloseStream { work });
            }
        }
        let s = self.session_mut(now, id);
        let reason = match s.last_outcome {
            None | Some(Outcome::Completed) => EndReason::Completed,
            Some(_) => EndReason::Failed,
        };
        // Finishing on its own beats the shutdown's blanket intent: say what happened.
        if matches!(s.closing, None | Some(EndReason::Shutdown)) {
            s.closing = Some(reason);
        }
        // Settle before winding the subtree down: the cascade from a child
        // that finalizes during the wind-down reaches this session, and a
        // still-`registered` session with a close intent reads as claimed and
        // would be finalized mid-transition (then settled and finalized again,
        // breaking G2). Settled, it waits for its children like any other (G1).
        self.transition(now, id, State::Settled, Cause::AgentFinished);
        self.cancel_subtree(now, id, EndReason::ParentFinished);
        self.cascade(now, id, Cause::AgentFinished);
        Ok(Handled::Applied)
    }

    fn cancel(
        &mut self,
        now: Instant,
        id: SessionId,
        mode: CancelMode,
        reason: EndReason,
        cause: Cause,
    ) -> Result<Handled, Error> {
        let Some(s) = self.sessions.get(&id) else {
            return Err(Error::UnknownSession(id));
        };
        match s.state {
            State::Finalized => return Ok(Handled::AlreadyFinalized),
            // G6: already cancelled, or already ended on its own.
            State::Cancelling | State::Settled => return Ok(Handled::NoOp),
            State::Registered | State::Running => {}
        }
        self.cancel_subtree(now, id, EndReason::Cancelled);
        self.cancel_one(now, id, mode, reason, cause);
        self.cascade(now, id, cause);
        Ok(Handled::Applied)
    }

    fn cancel_turn(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        self.open_session(id)?;
        let settle_at = now + self.policy.settle_timeout;
        let s = self.session_mut(now, id);
        let Some(work) = s.work.as_mut() else {
            return Ok(Handled::NoOp);
        };
        if work.cancel.is_some() {
            return Ok(Handled::NoOp);
        }
        work.cancel = Some(CancelMode::Immediate);
        work.turn_only = true;
        let close = work.stream_needs_close();
        work.close_sent |= close;
        let work = work.id(id);
        s.settle_deadline = Some(settle_at);
        self.deadlines.arm(settle_at, id, Timer::Settle);
        self.effects.push_back(crate::Effect::CancelWork {
            work,
            mode: CancelMode::Immediate,
        });
        if close {
            self.effects.push_back(crate::Effect::CloseStream { work });
        }
        Ok(Handled::Applied)
    }

    fn cancel_descendants(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        let Some(s) = self.sessions.get(&id) else {
            return Err(Error::UnknownSession(id));
        };
        if s.state == State::Finalized {
            return Ok(Handled::AlreadyFinalized);
        }
        if self.cancel_subtree(now, id, EndReason::Cancelled) == 0 {
            return Ok(Handled::NoOp);
        }
        Ok(Handled::Applied)
    }

    fn hold(
        &mut self,
        now: Instant,
        id: SessionId,
        hold: Hold,
        add: bool,
    ) -> Result<Handled, Error> {
        self.open_session(id)?;
        let s = self.session_mut(now, id);
        let slot = s.holds.slot(hold);
        if add {
            *slot = slot.saturating_add(1);
        } else if *slot == 0 {
            return Ok(Handled::NoOp);
        } else {
            *slot -= 1;
            if s.holds.is_empty() && s.work.is_none() {
                s.idle_since = now;
            }
        }
        self.after_turn(now, id);
        Ok(Handled::Applied)
    }

    fn transport_attached(
        &mut self,
        now: Instant,
        id: SessionId,
        close_on_disconnect: bool,
    ) -> Result<Handled, Error> {
        self.open_session(id)?;
        let s = self.session_mut(now, id);
        s.transport.attached = s.transport.attached.saturating_add(1);
        s.transport.close_on_disconnect |= close_on_disconnect;
        s.orphan_deadline = None;
        Ok(Handled::Applied)
    }

    fn transport_detached(&mut self, now: Instant, id: SessionId) -> Result<Handled, Error> {
        self.open_session(id)?;
        let grace = self.policy.orphan_grace;
        let s = self.session_mut(now, id);
        if s.transport.attached == 0 {
            return Ok(Handled::NoOp);
        }
        s.transport.attached -= 1;
        if s.transport.attached > 0 {
            return Ok(Handled::Applied);
        }
        if s.transport.close_on_disconnect {
            s.transport.close_pending = true;
            self.after_turn(now, id);
        } else {
            let at = now + grace;
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
                let due: Vec<SessionId> = self
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.orphan_deadline.is_some_and(|at| at <= now))
                    .map(|(id, _)| *id)
                    .collect();
                for id in due {
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
        if self.shutdown.is_some() {
            return Handled::NoOp;
        }
        self.shutdown = Some(Shutdown {
            drained: false,
            complete_sent: false,
        });
        // No automatic path but the shutdown's own runs from here on.
        for (_, id) in self.deadlines.take_idle() {
            if let Some(s) = self.sessions.get_mut(&id) {
                s.indexed_since = None;
                s.idle_key = None;
            }
        }
        let order = open_sessions_bottom_up(&self.sessions);
        for &id in &order {
            let s = self.session_mut(now, id);
            s.closing.get_or_insert(EndReason::Shutdown);
            self.effects
                .push_back(crate::Effect::FlushTranscript { session: id });
        }
        // Idle sessions go now, children before parents; running turns drain.
        for &id in &order {
            self.settle_or_finalize(now, id, Cause::DescendantsSettled);
        }
        if drain.is_zero() {
            self.end_drain(now);
        } else {
            self.deadlines.drain = Some(now + drain);
        }
        Handled::Applied
    }

    fn skip_drain(&mut self, now: Instant) -> Handled {
        match self.shutdown {
            Some(s) if !s.drained => {
                self.end_drain(now);
                Handled::Applied
            }
            _ => Handled::NoOp,
        }
    }

    // ----- deadlines ------------------------------------------------------

    /// G5: the work had its chance to unwind; abandon it.
    fn settle_deadline(&mut self, now: Instant, id: SessionId) {
        let s = self.session_mut(now, id);
        s.settle_deadline = None;
        let Some(work) = s.work.take() else { return };
        s.last_outcome = Some(Outcome::Detached);
        let work_id = work.id(id);
        if work.stream_needs_close() {
            self.effects
                .push_back(crate::Effect::CloseStream { work: work_id });
        }
        self.effects
            .push_back(crate::Effect::DetachWork { work: work_id });
        if self.session_mut(now, id).state == State::Running {
            // Only the turn was cancelled: the session goes on.
            self.session_mut(now, id).idle_since = now;
            self.transition(now, id, State::Registered, Cause::SettleDeadline);
            self.after_turn(now, id);
        } else {
            self.cascade(now, id, Cause::SettleDeadline);
        }
    }

    fn orphan_deadline(&mut self, now: Instant, id: SessionId) {
        let grace = self.policy.orphan_grace;
        let s = self.session_mut(now, id);
        s.orphan_deadline = None;
        if s.transport.attached > 0 || s.state.rank() >= State::Settled.rank() {
            return;
        }
        if !self.claim(now, id, EndReason::OrphanReap) && s_is_open(&self.sessions, id) {
            // Skipped because a turn (or hold) is live: try again later (SPEC §5).
            let at = now + grace;
            self.session_mut(now, id).orphan_deadline = Some(at);
            self.deadlines.arm(at, id, Timer::Orphan);
        }
    }

    fn reap_idle(&mut self, now: Instant) {
        let Some(ttl) = self.policy.idle_ttl else {
            return;
        };
        while let Some((since, id)) = self.oldest_idle() {
            if since.checked_add(ttl).is_none_or(|at| at > now) {
                break;
            }
            self.deadlines.pop_idle();
            self.unindex(id);
            self.claim(now, id, EndReason::IdleReap);
        }
    }

    fn enforce_lru_cap(&mut self, now: Instant) {
        let Some(cap) = self.policy.lru_cap else {
            return;
        };
        while self.open > cap {
            let Some((_, id)) = self.oldest_idle() else {
                break;
            };
            self.deadlines.pop_idle();
            self.unindex(id);
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
            if self.session_mut(now, id).state == State::Running {
                let mode = CancelMode::Immediate;
                self.cancel_one(now, id, mode, EndReason::Shutdown, Cause::DrainEnded);
            }
        }
        // Held sessions were spared until now; nothing is spared any more.
        for &id in &order {
            self.settle_or_finalize(now, id, Cause::DescendantsSettled);
        }
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
        s.closing = Some(reason);
        self.cascade(now, id, Cause::DescendantsSettled);
        true
    }

    /// Cancels every open descendant of `id`, deepest first; returns how many.
    fn cancel_subtree(&mut self, now: Instant, id: SessionId, reason: EndReason) -> usize {
        let order = open_descendants_bottom_up(&self.sessions, id);
        let mut cancelled = 0;
        for &d in &order {
            let state = self.session_mut(now, d).state;
            if matches!(state, State::Registered | State::Running) {
                let mode = CancelMode::Immediate;
                self.cancel_one(now, d, mode, reason, Cause::AncestorWindingDown);
                self.cascade(now, d, Cause::AncestorWindingDown);
                cancelled += 1;
            }
        }
        cancelled
    }

    /// Cancels one registered or running session (its descendants are the
    /// caller's business): cancel its work once (G6), close its stream if the
    /// cancel is immediate, arm the settle deadline (G5).
    fn cancel_one(
        &mut self,
        now: Instant,
        id: SessionId,
        mode: CancelMode,
        reason: EndReason,
        cause: Cause,
    ) {
        let settle_at = now + self.policy.settle_timeout;
        let s = self.session_mut(now, id);
        if !matches!(s.state, State::Registered | State::Running) {
            return;
        }
        // An explicit cancel, close or finish says what happened and beats the
        // shutdown's blanket intent (as in `agent_finished`); a `shutdown`
        // reason is left to what the shutdown itself ends (G3).
        if matches!(s.closing, None | Some(EndReason::Shutdown)) {
            s.closing = Some(reason);
        }
        let mut effects = [None, None];
        if let Some(work) = s.work.as_mut() {
            work.turn_only = false;
            if work.cancel.is_none() {
                work.cancel = Some(mode);
                effects[0] = Some(crate::Effect::CancelWork {
                    work: work.id(id),
                    mode,
                });
            }
            if mode == CancelMode::Immediate && work.stream_needs_close() {
                work.close_sent = true;
                effects[1] = Some(crate::Effect::CloseStream { work: work.id(id) });
            }
            if s.settle_deadline.is_none() {
                s.settle_deadline = Some(settle_at);
                self.deadlines.arm(settle_at, id, Timer::Settle);
            }
        }
        self.effects.extend(effects.into_iter().flatten());
        let s = self.session_mut(now, id);
        let to = if s.work.is_none() && s.unsettled_children == 0 {
            State::Settled
        } else {
            State::Cancelling
        };
        self.transition(now, id, to, cause);
    }

    /// After a turn ended or a hold or transport changed: claims that were
    /// waiting for the session to be idle, and a closing session's finalize.
    fn after_turn(&mut self, now: Instant, id: SessionId) {
        let s = self.session_mut(now, id);
        if s.transport.close_pending && s.transport.attached == 0 && s.is_reclaimable() {
            s.transport.close_pending = false;
            self.claim(now, id, EndReason::TransportClosed);
        }
        self.cascade(now, id, Cause::DescendantsSettled);
        self.refresh_index(id);
    }

    /// Settles and finalizes `id` if it may be, then walks up: each ancestor
    /// that becomes settled or finalized lets its own parent move (G1).
    fn cascade(&mut self, now: Instant, id: SessionId, cause: Cause) {
        let mut node = Some(id);
        let mut cause = cause;
        // The caller may already have moved `id`, so its parent is always looked at.
        let mut look_at_parent = true;
        while let Some(current) = node {
            let changed = self.settle_or_finalize(now, current, cause);
            if !changed && !look_at_parent {
                break;
            }
            look_at_parent = false;
            node = self.sessions.get(&current).and_then(|s| s.parent);
            cause = Cause::DescendantsSettled;
        }
    }

    fn settle_or_finalize(&mut self, now: Instant, id: SessionId, cause: Cause) -> bool {
        let drained = self.is_drained();
        let Some(s) = self.sessions.get(&id) else {
            return false;
        };
        // Decided from one lookup: most calls find nothing to do.
        let settle = s.state == State::Cancelling && s.work.is_none() && s.unsettled_children == 0;
        let state = if settle { State::Settled } else { s.state };
        let finalize = s.work.is_none()
            && s.unfinalized_children == 0
            && match (state, s.closing) {
                (State::Settled, Some(_)) => true,
                // A claimed idle session, or one closed by shutdown; a held one
                // waits for the end of the drain.
                (State::Registered, Some(_)) => s.holds.is_empty() || drained,
                _ => false,
            };
        if settle {
            self.transition(now, id, State::Settled, cause);
        }
        if finalize {
            self.finalize(now, id);
        }
        settle || finalize
    }

    /// Spends the latch (G2): emitted once, the state is terminal.
    fn finalize(&mut self, now: Instant, id: SessionId) {
        let s = self.session_mut(now, id);
        let reason = s.closing.unwrap_or(EndReason::Completed);
        let last_outcome = s.last_outcome;
        s.settle_deadline = None;
        s.orphan_deadline = None;
        s.children.shrink_to_fit();
        self.transition(now, id, State::Finalized, Cause::Finalized(reason));
        self.effects.push_back(crate::Effect::Finalize(Finalize {
            session: id,
            reason,
            last_outcome,
            commit_memory: last_outcome == Some(Outcome::Completed),
        }));
    }

    /// Moves `id` to `to`, records it, and keeps the parent's counts and the
    /// idle index true.
    fn transition(&mut self, now: Instant, id: SessionId, to: State, cause: Cause) {
        let s = self.session_mut(now, id);
        let from = s.state;
        s.state = to;
        let parent = s.parent;
        let was_unsettled = from.is_open();
        if let Some(p) = parent.and_then(|p| self.sessions.get_mut(&p)) {
            if was_unsettled && !to.is_open() {
                p.unsettled_children -= 1;
            }
            if to == State::Finalized {
                p.unfinalized_children -= 1;
            }
        }
        if to == State::Finalized {
            self.open -= 1;
        }
        self.record(now, id, Some(from), to, cause);
        self.refresh_index(id);
        if let Some(p) = parent {
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
        self.effects
            .push_back(crate::Effect::Transition(Transition {
                session,
                at,
                from,
                to,
                cause,
            }));
    }

    /// Puts `id` in the idle index exactly when it is reclaimable.
    fn refresh_index(&mut self, id: SessionId) {
        let shutting_down = self.shutdown.is_some();
        let Some(s) = self.sessions.get_mut(&id) else {
            return;
        };
        let want = (!shutting_down && s.is_reclaimable()).then_some(s.idle_since);
        s.indexed_since = want;
        // An entry already in the heap is early or on time; it is re-armed
        // when it surfaces. Only a session with no entry needs one.
        if let (Some(since), None) = (want, s.idle_key) {
            s.idle_key = Some(since);
            self.deadlines.index_idle(since, id);
        }
    }

    /// Marks `id` as out of the idle index, once its entry was popped.
    fn unindex(&mut self, id: SessionId) {
        if let Some(s) = self.sessions.get_mut(&id) {
            s.indexed_since = None;
            s.idle_key = None;
        }
    }

    /// The oldest idle session and since when, after dropping the entries of
    /// sessions no longer reclaimable and re-arming the ones that surfaced
    /// early (their session went busy and idle again since).
    fn oldest_idle(&mut self) -> Option<(Instant, SessionId)> {
        while let Some((key, id)) = self.deadlines.oldest_idle() {
            let Some(s) = self.sessions.get_mut(&id) else {
                self.deadlines.pop_idle();
                continue;
            };
            if s.idle_key != Some(key) {
                // Not this session's entry any more (it was taken at shutdown).
                self.deadlines.pop_idle();
                continue;
            }
            match s.indexed_since {
                Some(since) if since == key => return Some((key, id)),
                Some(since) => {
                    self.deadlines.pop_idle();
                    s.idle_key = Some(since);
                    self.deadlines.index_idle(since, id);
                }
                None => {
                    self.deadlines.pop_idle();
                    s.idle_key = None;
                }
            }
        }
        None
    }

    /// After every input: announce the end of a shutdown once. Stale entries
    /// on top of the deadline table are left for `handle_timeout` to drop:
    /// at worst they cost the driver one spurious wake, which is a no-op.
    fn settle_bookkeeping(&mut self) {
        if let Some(shutdown) = self.shutdown.as_mut() {
            if self.open == 0 && !shutdown.complete_sent {
                shutdown.complete_sent = true;
                self.effects.push_back(crate::Effect::ShutdownComplete);
            }
        }
    }

    fn clock(&mut self, now: Instant) -> Instant {
        let now = self.now.map_or(now, |seen| seen.max(now));
        self.now = Some(now);
        now
    }

    fn open_session(&self, id: SessionId) -> Result<&Session, Error> {
        match self.sessions.get(&id) {
            None => Err(Error::UnknownSession(id)),
            Some(s) if s.state == State::Finalized => Err(Error::SessionClosed(id)),
            Some(s) => Ok(s),
        }
    }

    /// For ids the core itself put in its tables. A missing one would be a
    /// bug in the core; the fallback keeps a release build from panicking on it.
    fn session_mut(&mut self, now: Instant, id: SessionId) -> &mut Session {
        self.sessions.entry(id).or_insert_with(|| {
            debug_assert!(false, "session {id} vanished from the core's table");
            let mut ghost = Session::new(None, now);
            ghost.state = State::Finalized;
            ghost
        })
    }

    /// How many entries the deadline table holds (stale ones included); for tests.
    #[doc(hidden)]
    pub fn deadline_entries(&self) -> usize {
        self.deadlines.len()
    }
}

fn s_is_open(sessions: &SessionMap<Session>, id: SessionId) -> bool {
    sessions
        .get(&id)
        .is_some_and(|s| s.state.is_open() && s.closing.is_none())
}

fn wrong_state(session: SessionId, state: State, action: &'static str) -> Error {
    Error::WrongState {
        session,
        state,
        action,
    }
}
