//! The reference model: what SPEC.md §2–5 and the contract on `Event`,
//! `Effect` and `Core` say the core does, said as plainly as possible.
//!
//! Plain structs and linear scans over every session; after each change a
//! fixpoint settles and finalizes whatever may be (the core walks up the
//! tree from what changed instead). For every input the model predicts the
//! answer (`Ok(Applied)`, `Ok(NoOp)`, `Ok(AlreadyFinalized)` or which `Err`),
//! the orders the core gives (every effect but the timeline's transitions),
//! the next deadline, and what every session view says afterwards.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use proptest_state_machine::ReferenceStateMachine;
use settle_core::{
    BudgetLimit, CancelMode, DeadlineKind, Effect, EndReason, Error, Finalize, HandOff, Handled,
    Hold, Outcome, Policy, SessionId, ShutdownSummary, State, Sweep, WorkId, WorkKind,
};

use crate::strategies::{self, Span, Step};

/// The tunables of one run, on the fake clock.
#[derive(Debug, Clone)]
pub struct RefPolicy {
    pub settle: Span,
    /// `None`: no idle reap.
    pub idle_ttl: Option<Span>,
    pub lru_cap: Option<usize>,
    pub orphan_grace: Span,
    /// `None`: no limit on active-session slots.
    pub slots: Option<usize>,
}

impl RefPolicy {
    pub fn to_policy(&self) -> Policy {
        Policy::default()
            .settle_timeout(self.settle.duration())
            .idle_ttl(self.idle_ttl.map(Span::duration))
            .lru_cap(self.lru_cap)
            .orphan_grace(self.orphan_grace.duration())
            .slots(self.slots)
    }
}

/// One work in flight.
#[derive(Debug, Clone)]
pub struct RefWork {
    pub id: WorkId,
    /// The one cancel it was sent (G6).
    pub cancel: Option<CancelMode>,
    pub attached: bool,
    /// The work reported its stream closed.
    pub closed: bool,
    /// The core ordered its stream closed.
    pub close_ordered: bool,
    /// Its start was refused to its caller: it is ending.
    pub start_refused: bool,
    /// When it is detached if it has not ended by then (G5).
    pub settle_at: Option<u64>,
}

impl RefWork {
    /// A stream nobody closed or ordered closed yet.
    fn stream_open(&self) -> bool {
        self.attached && !self.closed && !self.close_ordered
    }
}

/// Why a session will be finalized, once that is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Intent {
    /// The agent finished: the reason follows its last turn (`Event::AgentFinished`).
    Finished,
    End(EndReason),
    /// A handoff releases it once idle (SPEC §12).
    HandOff,
}

impl Intent {
    pub fn reason(self, last: Option<Outcome>) -> EndReason {
        match (self, last) {
            (Intent::End(reason), _) => reason,
            (Intent::HandOff, _) => EndReason::Shutdown,
            (Intent::Finished, None | Some(Outcome::Completed)) => EndReason::Completed,
            (Intent::Finished, Some(Outcome::Failed | Outcome::IdleTimeout)) => EndReason::Failed,
            (Intent::Finished, Some(_)) => EndReason::Cancelled,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RefSession {
    pub parent: Option<u64>,
    pub state: State,
    /// At most one turn, any number of tasks.
    pub works: Vec<RefWork>,
    pub turns: u32,
    /// The turns it came with when it was adopted (0 when registered).
    pub entry_turns: u32,
    pub tasks: u32,
    /// Of its last turn (tasks have no transcript).
    pub last_outcome: Option<Outcome>,
    /// Of its last task: its record's outcome when it ran no turn.
    pub last_task_outcome: Option<Outcome>,
    pub intent: Option<Intent>,
    /// Once finalized.
    pub end_reason: Option<EndReason>,
    pub holds: [u32; 2],
    pub transports: u32,
    pub close_on_disconnect: bool,
    /// A reclaim that found it busy and waits until it is reclaimable.
    pub pending: Option<EndReason>,
    pub idle_since: u64,
    pub orphan_at: Option<u64>,
    /// Its turn was running when the shutdown began.
    pub running_at_shutdown: bool,
    /// It holds an active-session slot: from its first turn to its finalize.
    pub has_slot: bool,
    /// Its own budget, and what its subtree spent.
    pub budget: Option<RefBudget>,
    /// It or an ancestor has a budget.
    pub budgeted: bool,
    /// Whose it is, for the LRU cap.
    pub scope: u64,
    /// Registered at the cap: the room it needs is made once its
    /// registration is committed.
    pub room_owed: bool,
}

/// A session's budget and what its subtree spent.
#[derive(Debug, Clone)]
pub struct RefBudget {
    pub max_turns: Option<u32>,
    pub max_tokens: Option<u64>,
    /// When its wall time runs out.
    pub deadline: Option<u64>,
    pub turns: u32,
    pub tokens: u64,
    pub exhausted: bool,
}

impl RefSession {
    /// A session as a registration leaves it.
    pub fn new(parent: Option<u64>, now: u64) -> Self {
        RefSession {
            parent,
            state: State::Registered,
            works: Vec::new(),
            turns: 0,
            entry_turns: 0,
            tasks: 0,
            last_outcome: None,
            last_task_outcome: None,
            intent: None,
            end_reason: None,
            holds: [0; 2],
            transports: 0,
            close_on_disconnect: false,
            pending: None,
            idle_since: now,
            orphan_at: None,
            running_at_shutdown: false,
            has_slot: false,
            budget: None,
            budgeted: false,
            scope: 0,
            room_owed: false,
        }
    }

    pub fn held(&self) -> bool {
        self.holds.iter().any(|n| *n > 0)
    }

    fn turn(&self) -> Option<&RefWork> {
        self.works.iter().find(|w| w.id.kind == WorkKind::Turn)
    }
}

#[derive(Debug, Clone, Default)]
pub struct RefShutdown {
    /// The end of the drain; `None` once over, or when it never ends by itself.
    pub drain_until: Option<u64>,
    pub drained: bool,
    pub complete_sent: bool,
    pub summary: ShutdownSummary,
}

/// What the core answers to one step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Handled(Result<Handled, Error>),
    Forgot(bool),
    Ticked,
}

#[derive(Debug, Clone)]
pub struct Model {
    pub policy: RefPolicy,
    /// Milliseconds since the start of the run.
    pub now: u64,
    pub sessions: BTreeMap<u64, RefSession>,
    pub forgotten: BTreeSet<u64>,
    /// The records of forgotten sessions: the answers they get are a
    /// finalized session's.
    pub tombstones: BTreeMap<u64, RefSession>,
    /// Outstanding delegations: delegating session → sessions delegated to.
    pub delegations: BTreeMap<u64, Vec<u64>>,
    /// Sessions delegated to by one finalized during the current input.
    pub interrupts: Vec<u64>,
    /// Ids are never reused, as a store's row ids are not.
    pub next_id: u64,
    pub shutdown: Option<RefShutdown>,
    /// The lease was lost: finalizes from then on end `recovered` (G8).
    pub lease_lost: bool,
    /// Sessions released for another process to adopt (SPEC §12).
    pub handed_off: BTreeSet<u64>,
    /// The answer to the last step.
    pub answer: Answer,
    /// The orders the last step gave, in no particular order.
    pub orders: Vec<Effect>,
}

/// A session's hold counts as the core gives them (saturating at its width).
fn holds_of(s: &RefSession) -> settle_core::Holds {
    let count = |n: u32| u16::try_from(n).unwrap_or(u16::MAX);
    settle_core::Holds {
        pending_input: count(s.holds[slot(Hold::PendingInput)]),
        delegation: count(s.holds[slot(Hold::Delegation)]),
    }
}

fn slot(hold: Hold) -> usize {
    match hold {
        Hold::PendingInput => 0,
        Hold::Delegation => 1,
    }
}

fn wrong_state(session: u64, state: State, action: &'static str) -> Error {
    Error::WrongState {
        session: SessionId(session),
        state,
        action,
    }
}

impl Model {
    pub fn new(policy: RefPolicy) -> Self {
        Model {
            policy,
            now: 0,
            sessions: BTreeMap::new(),
            forgotten: BTreeSet::new(),
            tombstones: BTreeMap::new(),
            delegations: BTreeMap::new(),
            interrupts: Vec::new(),
            next_id: 1,
            shutdown: None,
            lease_lost: false,
            handed_off: BTreeSet::new(),
            answer: Answer::Ticked,
            orders: Vec::new(),
        }
    }

    fn s(&mut self, id: u64) -> &mut RefSession {
        self.sessions.get_mut(&id).expect("a session of the model")
    }

    pub fn drained(&self) -> bool {
        self.shutdown.as_ref().is_some_and(|s| s.drained)
    }

    pub fn open_count(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| s.state != State::Finalized)
            .count()
    }

    fn children(&self, id: u64) -> Vec<u64> {
        self.sessions
            .iter()
            .filter(|(_, s)| s.parent == Some(id))
            .map(|(c, _)| *c)
            .collect()
    }

    fn open_children(&self, id: u64) -> usize {
        self.children(id)
            .iter()
            .filter(|c| self.sessions[c].state.is_open())
            .count()
    }

    fn unfinalized_children(&self, id: u64) -> usize {
        self.children(id)
            .iter()
            .filter(|c| self.sessions[c].state != State::Finalized)
            .count()
    }

    /// Every descendant of `id`, each after all of its own descendants.
    fn descendants_bottom_up(&self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for c in self.children(id) {
            out.extend(self.descendants_bottom_up(c));
            out.push(c);
        }
        out
    }

    /// Works that were started and are over (ended, or detached): the late
    /// reports the generator sends.
    pub fn old_works(&self) -> Vec<WorkId> {
        let mut out = Vec::new();
        for (id, s) in &self.sessions {
            let sid = SessionId(*id);
            let all = (1..=s.turns)
                .map(|no| WorkId::turn(sid, no))
                .chain((1..=s.tasks).map(|no| WorkId::task(sid, no)));
            out.extend(all.filter(|w| !s.works.iter().any(|l| l.id == *w)));
        }
        out
    }

    /// SPEC §5, the predicate of every automatic path: registered, no work,
    /// not closing, no hold, and (G1) no child still to be finalized.
    pub fn reclaimable(&self, id: u64) -> bool {
        let s = &self.sessions[&id];
        s.state == State::Registered
            && s.works.is_empty()
            && s.intent.is_none()
            && !s.held()
            && self.unfinalized_children(id) == 0
    }

    // ----- the fixpoint -----------------------------------------------------

    /// Settles and finalizes whatever may be, and runs the reclaims that
    /// waited for a session to be idle, until nothing moves.
    fn fixpoint(&mut self) {
        loop {
            let mut moved = false;
            let ids: Vec<u64> = self.sessions.keys().copied().collect();
            for id in ids {
                moved |= self.settle_or_finalize(id);
            }
            if !moved {
                break;
            }
        }
    }

    fn settle_or_finalize(&mut self, id: u64) -> bool {
        let open_children = self.open_children(id);
        let unfinalized = self.unfinalized_children(id);
        let reclaimable = self.reclaimable(id);
        let shutting_down = self.shutdown.is_some();
        let drained = self.drained();
        let lease_lost = self.lease_lost;
        let s = self.s(id);
        if s.state == State::Finalized {
            return false;
        }
        // A dropped close-on-disconnect transport, or a zero orphan grace:
        // claimed once it is idle (SPEC §5, §10).
        if let Some(reason) = s.pending {
            if reclaimable && s.transports == 0 && !shutting_down {
                s.pending = None;
                s.intent = Some(Intent::End(reason));
            }
        }
        let mut moved = false;
        if s.state == State::Cancelling && s.works.is_empty() && open_children == 0 {
            s.state = State::Settled;
            moved = true;
        }
        let may_finalize = s.works.is_empty()
            && unfinalized == 0
            && s.intent.is_some()
            && match s.state {
                State::Settled => true,
                // Claimed, or idle at shutdown: a held one waits for the
                // end of the drain, unless it is handed off (its holds go
                // with it).
                State::Registered => {
                    !s.held() || drained || (s.intent == Some(Intent::HandOff) && !lease_lost)
                }
                _ => false,
            };
        let hand_off = s.intent == Some(Intent::HandOff) && s.state == State::Registered;
        if may_finalize && hand_off && !self.lease_lost {
            self.hand_off(id);
            moved = true;
        } else if may_finalize {
            self.finalize(id);
            moved = true;
        }
        moved
    }

    /// SPEC §12: released, and gone from this core.
    fn hand_off(&mut self, id: u64) {
        let s = self.sessions.remove(&id).expect("a session of the model");
        self.delegations.remove(&id);
        self.handed_off.insert(id);
        if let Some(shutdown) = self.shutdown.as_mut() {
            shutdown.summary.released.push(SessionId(id));
        }
        self.orders.push(Effect::HandOff(HandOff {
            session: SessionId(id),
            turns: s.turns,
            last_outcome: s.last_outcome,
            holds: holds_of(&s),
        }));
    }

    /// A hold was taken or given back: its counts are recorded for whoever
    /// adopts the session (SPEC §5).
    fn record_holds(&mut self, id: u64) {
        let holds = holds_of(self.s(id));
        self.orders.push(Effect::RecordHolds {
            session: SessionId(id),
            holds,
        });
    }

    fn finalize(&mut self, id: u64) {
        let shutting_down = self.shutdown.is_some();
        let lease_lost = self.lease_lost;
        let s = self.s(id);
        let intent = s.intent.expect("finalized with a reason");
        // G9: whatever asked for it, after shutdown began the reason is
        // `shutdown`; G8: once the lease is lost, `recovered`.
        let reason = if lease_lost {
            EndReason::Recovered
        } else if shutting_down {
            EndReason::Shutdown
        } else {
            intent.reason(s.last_outcome)
        };
        s.state = State::Finalized;
        s.end_reason = Some(reason);
        s.orphan_at = None;
        s.has_slot = false;
        let last_outcome = s.last_outcome;
        let outcome = last_outcome.or(s.last_task_outcome);
        // SPEC §4 step 6: what it delegated to is interrupted after the input.
        // Not its own ancestors (G1: a wind-down never cancels its caller).
        if let Some(to) = self.delegations.remove(&id) {
            let mut ancestors = Vec::new();
            let mut at = self.sessions[&id].parent;
            while let Some(p) = at {
                ancestors.push(p);
                at = self.sessions.get(&p).and_then(|s| s.parent);
            }
            self.interrupts
                .extend(to.into_iter().filter(|d| !ancestors.contains(d)));
        }
        // SPEC §5: a held session's kept holds go with it.
        let holds = holds_of(&self.sessions[&id]);
        if holds != settle_core::Holds::default() {
            self.orders.push(Effect::RecordHolds {
                session: SessionId(id),
                holds: settle_core::Holds::default(),
            });
        }
        self.orders.push(Effect::Finalize(Finalize {
            session: SessionId(id),
            reason,
            last_outcome,
            outcome,
            commit_memory: last_outcome == Some(Outcome::Completed),
            in_shutdown: shutting_down,
        }));
    }

    // ----- the shared mechanisms -------------------------------------------

    /// An automatic reclaim: the predicate and the mark in one step (G3).
    fn claim(&mut self, id: u64, reason: EndReason) -> bool {
        if self.shutdown.is_some() || !self.reclaimable(id) {
            return false;
        }
        self.s(id).intent = Some(Intent::End(reason));
        self.fixpoint();
        true
    }

    /// Sends each live work of `id` (only its turn, with `turn_only`) its one
    /// cancel (G6) and arms its settle deadline (G5). The work closes its own
    /// stream when its token is cancelled; the core orders a close only on
    /// the attach race and at a detach (G4). Returns how many it cancelled.
    fn cancel_works(&mut self, id: u64, mode: CancelMode, turn_only: bool) -> usize {
        let settle_at = self.policy.settle.after(self.now);
        let mut orders = Vec::new();
        let s = self.s(id);
        for w in &mut s.works {
            if w.cancel.is_some() || (turn_only && w.id.kind != WorkKind::Turn) {
                continue;
            }
            w.cancel = Some(mode);
            orders.push(Effect::CancelWork { work: w.id, mode });
            w.settle_at = settle_at;
        }
        let n = orders
            .iter()
            .filter(|o| matches!(o, Effect::CancelWork { .. }))
            .count();
        self.orders.extend(orders);
        n
    }

    /// Cancels one open, not yet cancelled session (its subtree is the
    /// caller's business).
    fn cancel_one(&mut self, id: u64, mode: CancelMode, reason: EndReason) {
        self.mark_cancelled(id, mode, reason);
        self.fixpoint();
    }

    /// A session's cancel, before anything settles: closing with `reason`
    /// (unless it was closing already), its works asked to stop.
    fn mark_cancelled(&mut self, id: u64, mode: CancelMode, reason: EndReason) {
        let s = self.s(id);
        if !matches!(s.state, State::Registered | State::Running) {
            return;
        }
        s.intent.get_or_insert(Intent::End(reason));
        s.state = State::Cancelling;
        self.cancel_works(id, mode, false);
    }

    /// G1: every open descendant, deepest first; returns how many. The
    /// whole subtree is marked closing with `reason` first, and only then
    /// does anything in it settle or finalize: a session waiting for its
    /// children to be reclaimed (a dropped transport's close) ends with the
    /// subtree's reason, whatever order its children finalize in.
    fn cancel_subtree(&mut self, id: u64, mode: CancelMode, reason: EndReason) -> usize {
        let mut n = 0;
        let order = self.descendants_bottom_up(id);
        // Closed, not handed off on the way (SPEC §12).
        for d in &order {
            let s = self.s(*d);
            if s.intent == Some(Intent::HandOff) && s.state != State::Finalized {
                s.intent = Some(Intent::End(reason));
            }
        }
        for d in order {
            if matches!(self.sessions[&d].state, State::Registered | State::Running) {
                self.mark_cancelled(d, mode, reason);
                n += 1;
            }
        }
        self.fixpoint();
        n
    }

    /// The work is over, reported or detached.
    fn end_work(&mut self, work: WorkId, outcome: Outcome) {
        let now = self.now;
        let s = self.s(work.session.get());
        s.works.retain(|w| w.id != work);
        match work.kind {
            WorkKind::Turn => s.last_outcome = Some(outcome),
            WorkKind::Task => s.last_task_outcome = Some(outcome),
        }
        if s.works.is_empty() && s.state == State::Running {
            // A turn ended: the session stays open for the next one.
            s.state = State::Registered;
            s.idle_since = now;
        }
        self.orders.push(Effect::EndWork { work, outcome });
        self.fixpoint();
    }

    fn enforce_lru_cap(&mut self) {
        let Some(cap) = self.policy.lru_cap else {
            return;
        };
        while self.open_count() > cap {
            let victim = self
                .sessions
                .iter()
                .filter(|(id, _)| self.reclaimable(**id))
                .map(|(id, s)| (s.idle_since, *id))
                .min();
            match victim {
                Some((_, id)) if self.claim(id, EndReason::LruEvict) => {}
                _ => break,
            }
        }
    }

    fn reap_idle(&mut self) {
        let Some(Span::Ms(ttl)) = self.policy.idle_ttl else {
            return;
        };
        loop {
            let due = self
                .sessions
                .iter()
                .filter(|(id, s)| s.idle_since + ttl <= self.now && self.reclaimable(**id))
                .map(|(id, s)| (s.idle_since, *id))
                .min();
            match due {
                Some((_, id)) if self.claim(id, EndReason::IdleReap) => {}
                _ => break,
            }
        }
    }

    fn orphan_due(&mut self, id: u64) {
        let s = self.s(id);
        s.orphan_at = None;
        if s.transports > 0 || !s.state.is_open() || s.intent.is_some() {
            return;
        }
        if self.claim(id, EndReason::OrphanReap) {
            return;
        }
        // Skipped for a live work, a hold or a child: re-armed (SPEC §5),
        // or, with no grace at all, claimed as soon as it is idle.
        let grace = self.policy.orphan_grace;
        let now = self.now;
        let s = self.s(id);
        if grace.is_zero() {
            s.pending = Some(EndReason::OrphanReap);
        } else {
            s.orphan_at = grace.after(now);
        }
    }

    /// G5: the cancelled work had its chance; it is abandoned.
    fn settle_due(&mut self, work: WorkId) {
        let shutting_down = self.shutdown.is_some();
        let s = self.s(work.session.get());
        let w = s
            .works
            .iter()
            .find(|w| w.id == work)
            .expect("a live work")
            .clone();
        if w.stream_open() {
            self.orders.push(Effect::CloseStream { work });
        }
        self.orders.push(Effect::DetachWork { work });
        if shutting_down {
            if let Some(shutdown) = self.shutdown.as_mut() {
                shutdown.summary.detached.push(work);
            }
        }
        self.end_work(work, Outcome::Detached);
    }

    fn end_drain(&mut self) {
        let Some(shutdown) = self.shutdown.as_mut() else {
            return;
        };
        shutdown.drained = true;
        shutdown.drain_until = None;
        let running: Vec<u64> = self
            .sessions
            .iter()
            .filter(|(_, s)| s.state == State::Running)
            .map(|(id, _)| *id)
            .collect();
        for id in running {
            if let Some(shutdown) = self.shutdown.as_mut() {
                shutdown.summary.cancelled.push(SessionId(id));
            }
            if self.sessions[&id].intent == Some(Intent::HandOff) && !self.lease_lost {
                // Its turn is cancelled; the session stays open to be released.
                self.cancel_works(id, CancelMode::Immediate, false);
            } else {
                self.cancel_one(id, CancelMode::Immediate, EndReason::Shutdown);
            }
        }
        self.fixpoint();
    }

    /// Every deadline due now, in the order of one deadline table: by time,
    /// then session, settle (turn, then tasks) before orphan.
    fn handle_timeout(&mut self) {
        if self
            .shutdown
            .as_ref()
            .and_then(|s| s.drain_until)
            .is_some_and(|at| at <= self.now)
        {
            self.end_drain();
        }
        // Delegations interrupted by what the deadlines or the idle reap
        // finalized cancel works and free parents: until nothing is due.
        loop {
            self.fire_due();
            self.reap_idle();
            if self.interrupts.is_empty() {
                break;
            }
            self.interrupt_delegations();
        }
    }

    /// Every settle and orphan deadline due now, earliest first.
    fn fire_due(&mut self) {
        loop {
            let mut due: Vec<(u64, u64, u8, u32, Option<WorkId>)> = Vec::new();
            for (id, s) in &self.sessions {
                for w in &s.works {
                    if let Some(at) = w.settle_at {
                        let kind = if w.id.kind == WorkKind::Turn { 0 } else { 1 };
                        due.push((at, *id, kind, w.id.no, Some(w.id)));
                    }
                }
                if let Some(at) = s.orphan_at {
                    due.push((at, *id, 2, 0, None));
                }
                if let Some(at) = self.budget_deadline(*id) {
                    due.push((at, *id, 3, 0, None));
                }
            }
            let next = due.into_iter().filter(|d| d.0 <= self.now).min();
            match next {
                Some((_, _, _, _, Some(work))) => self.settle_due(work),
                Some((_, id, 2, _, None)) => self.orphan_due(id),
                Some((_, id, _, _, None)) => self.exhaust(id),
                None => break,
            }
        }
    }

    /// When the wall time of `id`'s budget runs out, while that matters:
    /// it is active and its budget not spent yet.
    fn budget_deadline(&self, id: u64) -> Option<u64> {
        let s = &self.sessions[&id];
        let b = s.budget.as_ref().filter(|b| !b.exhausted)?;
        if !matches!(s.state, State::Registered | State::Running) {
            return None;
        }
        b.deadline
    }

    /// SPEC §4 step 6 for the sessions finalized by the current input.
    fn interrupt_delegations(&mut self) {
        // G9: during the drain the shutdown owns every session; running
        // work keeps the drain.
        if self.shutdown.is_some() && !self.drained() {
            self.interrupts.clear();
            return;
        }
        while !self.interrupts.is_empty() {
            for to in std::mem::take(&mut self.interrupts) {
                let _ = self.cancel(to, CancelMode::Immediate, EndReason::Cancelled);
            }
        }
    }

    /// When the core must be woken next, and why (every kind due then: the
    /// core names one of them).
    pub fn next_deadline(&self) -> Option<(u64, Vec<DeadlineKind>)> {
        let mut all = Vec::new();
        for (id, s) in &self.sessions {
            for w in &s.works {
                all.extend(w.settle_at.map(|at| (at, DeadlineKind::Settle)));
            }
            all.extend(s.orphan_at.map(|at| (at, DeadlineKind::Orphan)));
            all.extend(
                self.budget_deadline(*id)
                    .map(|at| (at, DeadlineKind::Budget)),
            );
            if let (Some(Span::Ms(ttl)), None) = (self.policy.idle_ttl, &self.shutdown) {
                if self.reclaimable(*id) {
                    all.push((s.idle_since + ttl, DeadlineKind::IdleReap));
                }
            }
        }
        if let Some(at) = self.shutdown.as_ref().and_then(|s| s.drain_until) {
            all.push((at, DeadlineKind::Drain));
        }
        let first = all.iter().map(|(at, _)| *at).min()?;
        let kinds = all
            .into_iter()
            .filter(|(at, _)| *at == first)
            .map(|(_, kind)| kind)
            .collect();
        Some((first, kinds))
    }

    // ----- the inputs -----------------------------------------------------

    pub fn apply(&mut self, step: &Step) {
        self.orders.clear();
        self.answer = match *step {
            Step::Tick { millis } => {
                self.now += millis;
                self.handle_timeout();
                Answer::Ticked
            }
            Step::Forget(id) => {
                let finalized = self
                    .sessions
                    .get(&id)
                    .is_some_and(|s| s.state == State::Finalized);
                if finalized {
                    if let Some(s) = self.sessions.remove(&id) {
                        self.tombstones.insert(id, s);
                    }
                    self.forgotten.insert(id);
                }
                // `forget` is no input: no shutdown announcement follows it.
                return self.answer = Answer::Forgot(finalized);
            }
            _ => Answer::Handled(self.handle(step)),
        };
        if let Step::Register { session, .. } = *step {
            self.next_id = self.next_id.max(session + 1);
        }
        for (session, ..) in step.adopted() {
            self.next_id = self.next_id.max(session + 1);
        }
        // Delegations of the sessions finalized by the input are interrupted,
        // which may finalize more.
        self.interrupt_delegations();
        // After every input: the end of a shutdown is announced once.
        let open = self.open_count();
        if let Some(shutdown) = self.shutdown.as_mut() {
            if open == 0 && !shutdown.complete_sent {
                shutdown.complete_sent = true;
                let summary = std::mem::take(&mut shutdown.summary);
                self.orders
                    .push(Effect::ShutdownComplete(Box::new(summary)));
            }
        }
    }

    /// The session an input names, as the table on `Event` sees it: a
    /// forgotten session is still a finalized one.
    fn lookup(&self, id: u64) -> Result<&RefSession, Error> {
        if self.handed_off.contains(&id) {
            return Err(Error::HandedOff(SessionId(id)));
        }
        self.sessions
            .get(&id)
            .or_else(|| self.tombstones.get(&id))
            .ok_or(Error::UnknownSession(SessionId(id)))
    }

    /// For an input that uses the session: a finalized one is closed (G10).
    fn to_use(&self, id: u64) -> Result<&RefSession, Error> {
        let s = self.lookup(id)?;
        if s.state == State::Finalized {
            return Err(Error::SessionClosed(SessionId(id)));
        }
        Ok(s)
    }

    /// For an input that ends or lets go: `Ok(false)` when already finalized (G2).
    fn to_end(&self, id: u64) -> Result<bool, Error> {
        Ok(self.lookup(id)?.state != State::Finalized)
    }

    fn handle(&mut self, step: &Step) -> Result<Handled, Error> {
        use Handled::{AlreadyFinalized, Applied, NoOp};
        let now = self.now;
        // The table on `Event`: a handed-off session is another process's.
        if let Some(id) = step.session().filter(|id| self.handed_off.contains(id)) {
            if !matches!(step, Step::Adopt { .. }) {
                return match step.reports() {
                    true => Ok(NoOp),
                    false => Err(Error::HandedOff(SessionId(id))),
                };
            }
        }
        match *step {
            Step::Adopt {
                session,
                parent,
                turns,
                last_outcome,
                holds,
                scope,
                child,
            } => {
                let top = (session, parent, turns, last_outcome, holds, scope);
                let members: Vec<_> = match child {
                    None => vec![top],
                    Some(c) => {
                        let under = (
                            c.session,
                            Some(session),
                            c.turns,
                            c.last_outcome,
                            c.holds,
                            c.scope,
                        );
                        // Parents first; a child named first goes second,
                        // unless the parent's own parent is one of the two
                        // (a loop, no tree: the order given).
                        let looped = parent == Some(session) || parent == Some(c.session);
                        match c.first && looped {
                            true => vec![under, top],
                            false => vec![top, under],
                        }
                    }
                };
                // Every member or none (G1): each id free, no shutdown,
                // room for all under the cap (an adoption evicts nothing,
                // G12).
                for (i, m) in members.iter().enumerate() {
                    let taken =
                        self.sessions.contains_key(&m.0) || self.tombstones.contains_key(&m.0);
                    if taken || members[..i].iter().any(|o| o.0 == m.0) {
                        return Err(Error::DuplicateSession(SessionId(m.0)));
                    }
                }
                if self.shutdown.is_some() {
                    return Err(Error::ShuttingDown);
                }
                if let Some(cap) = self.policy.lru_cap {
                    if self.open_count() + members.len() > cap {
                        return Err(Error::NoRoomToAdopt { cap });
                    }
                }
                for (session, parent, turns, last_outcome, (pending_input, delegation), scope) in
                    members
                {
                    // Under its parent only when this core may give it one.
                    let parent = parent.filter(|p| {
                        self.sessions.get(p).is_some_and(|ps| {
                            matches!(ps.state, State::Registered | State::Running)
                                && ps.intent.is_none()
                        })
                    });
                    self.handed_off.remove(&session);
                    // A withdrawn id may come back, as a registration's never does.
                    self.forgotten.remove(&session);
                    // A budget over the parent it is adopted under counts it too.
                    let budgeted = parent
                        .and_then(|p| self.sessions.get(&p))
                        .is_some_and(|p| p.budgeted);
                    self.sessions.insert(
                        session,
                        RefSession {
                            turns,
                            entry_turns: turns,
                            last_outcome,
                            budgeted,
                            // Held where it was, held here (G3).
                            holds: [u32::from(pending_input), u32::from(delegation)],
                            scope,
                            ..RefSession::new(parent, now)
                        },
                    );
                }
                Ok(Applied)
            }
            Step::BeginHandoff { drain } => self.begin_shutdown(drain, true),
            Step::Register {
                session,
                parent,
                scope,
            } => {
                if self.sessions.contains_key(&session) || self.tombstones.contains_key(&session) {
                    return Err(Error::DuplicateSession(SessionId(session)));
                }
                if self.shutdown.is_some() {
                    return Err(Error::ShuttingDown);
                }
                if let Some(p) = parent {
                    let ps = self.to_use(p)?;
                    if !matches!(ps.state, State::Registered | State::Running)
                        || ps.intent.is_some()
                    {
                        return Err(Error::ParentNotLive {
                            parent: SessionId(p),
                            state: ps.state,
                            closing: ps.intent.is_some(),
                        });
                    }
                }
                // Room under the cap is found before the new session exists,
                // sparing its parent; refused, changing nothing, without it;
                // and made once the new session is its parent's child (G1).
                // None named: its parent's (0, the shared one, for a root).
                let scope = scope
                    .or_else(|| parent.and_then(|p| self.sessions.get(&p)).map(|p| p.scope))
                    .unwrap_or(0);
                let evict = self.room_for(parent, scope)?;
                let mut s = RefSession::new(parent, now);
                s.scope = scope;
                // A budget over the parent counts this session too.
                s.budgeted = parent
                    .and_then(|p| self.sessions.get(&p))
                    .is_some_and(|p| p.budgeted);
                // At the cap, no one is evicted before the registration is
                // committed (a refused one evicts no one).
                s.room_owed = !evict.is_empty();
                let owed = s.room_owed;
                self.sessions.insert(session, s);
                Ok(if owed {
                    Handled::EvictsOnCommit
                } else {
                    Applied
                })
            }
            Step::Committed(id) => {
                let s = self.lookup(id)?;
                if s.state == State::Finalized || !s.room_owed {
                    return Ok(NoOp);
                }
                let (parent, scope) = (s.parent, s.scope);
                self.s(id).room_owed = false;
                // What the committed sessions exceed the cap by: the room of a
                // registration still in flight is made when it commits.
                let owing = self
                    .sessions
                    .values()
                    .filter(|s| s.room_owed && s.state != State::Finalized)
                    .count();
                let needed = match (self.policy.lru_cap, &self.shutdown) {
                    (Some(cap), None) => (self.open_count() - owing).saturating_sub(cap),
                    _ => 0,
                };
                // The oldest idle committed ones of its scope, sparing it and
                // its parent; as many as there are, up to that.
                let mut victims: Vec<_> = self
                    .sessions
                    .iter()
                    .filter(|(v, s)| {
                        **v != id
                            && Some(**v) != parent
                            && s.scope == scope
                            && !s.room_owed
                            && self.reclaimable(**v)
                    })
                    .map(|(v, s)| (s.idle_since, *v))
                    .collect();
                victims.sort_unstable();
                victims.truncate(needed);
                if victims.is_empty() {
                    return Ok(NoOp);
                }
                for (_, v) in victims {
                    self.claim(v, EndReason::LruEvict);
                }
                Ok(Applied)
            }
            Step::StartTurn(id) | Step::StartTask(id) => {
                let kind = match step {
                    Step::StartTurn(_) => WorkKind::Turn,
                    _ => WorkKind::Task,
                };
                let s = self.to_use(id)?;
                if self.shutdown.is_some() {
                    return Err(Error::ShuttingDown);
                }
                if let Some(intent) = s.intent {
                    return Err(Error::Closing {
                        session: SessionId(id),
                        reason: intent.reason(s.last_outcome),
                    });
                }
                let action = match kind {
                    WorkKind::Turn => "start a turn",
                    WorkKind::Task => "start a task",
                };
                if !matches!(s.state, State::Registered | State::Running) {
                    return Err(wrong_state(id, s.state, action));
                }
                let taken = self.sessions.values().filter(|s| s.has_slot).count();
                let s = self.to_use(id)?;
                if kind == WorkKind::Turn {
                    if let Some(turn) = s.turn() {
                        // Ending: cancelled, or its start refused.
                        let ending = turn.cancel.is_some() || turn.start_refused;
                        return Err(match ending {
                            true => Error::TurnSettling {
                                session: SessionId(id),
                                turn: turn.id.no,
                            },
                            false => wrong_state(id, s.state, action),
                        });
                    }
                    if s.budgeted {
                        // The widest budget over it with no turn left.
                        let spent = self.budget_owners(id).into_iter().rev().find(|o| {
                            let b = self.sessions[o].budget.as_ref();
                            b.is_some_and(|b| b.max_turns.is_some_and(|max| b.turns >= max))
                        });
                        if let Some(owner) = spent {
                            self.exhaust(owner);
                            return Err(Error::BudgetExhausted {
                                session: SessionId(owner),
                                limit: BudgetLimit::Turns,
                            });
                        }
                    }
                    let s = self.to_use(id)?;
                    let full = self.policy.slots.is_some_and(|n| taken >= n);
                    if !s.has_slot && full {
                        return Err(Error::NoSlot {
                            slots: self.policy.slots.unwrap_or_default(),
                        });
                    }
                }
                if kind == WorkKind::Turn && self.sessions[&id].budgeted {
                    for owner in self.budget_owners(id) {
                        if let Some(b) = self.s(owner).budget.as_mut() {
                            b.turns += 1;
                        }
                    }
                }
                let s = self.s(id);
                if kind == WorkKind::Turn {
                    s.has_slot = true;
                }
                let no = match kind {
                    WorkKind::Turn => {
                        s.turns += 1;
                        s.turns
                    }
                    WorkKind::Task => {
                        s.tasks += 1;
                        s.tasks
                    }
                };
                let work = WorkId {
                    session: SessionId(id),
                    kind,
                    no,
                };
                s.works.push(RefWork {
                    id: work,
                    cancel: None,
                    attached: false,
                    closed: false,
                    close_ordered: false,
                    start_refused: false,
                    settle_at: None,
                });
                s.state = State::Running;
                Ok(Handled::Started(work))
            }
            Step::StreamAttached(work) => {
                let s = self.lookup(work.session.get())?;
                if !s.works.iter().any(|w| w.id == work) {
                    return Ok(NoOp);
                }
                let s = self.s(work.session.get());
                let w = s.works.iter_mut().find(|w| w.id == work).expect("live");
                if w.attached {
                    return Ok(NoOp);
                }
                w.attached = true;
                // Seed 001: the cancel landed before the stream attached.
                if w.cancel == Some(CancelMode::Immediate) && w.stream_open() {
                    w.close_ordered = true;
                    self.orders.push(Effect::CloseStream { work });
                }
                Ok(Applied)
            }
            Step::StreamClosed(work) => {
                let s = self.lookup(work.session.get())?;
                if !s.works.iter().any(|w| w.id == work && !w.closed) {
                    return Ok(NoOp);
                }
                let s = self.s(work.session.get());
                if let Some(w) = s.works.iter_mut().find(|w| w.id == work) {
                    w.closed = true;
                }
                Ok(Applied)
            }
            Step::StartRefused(work) => {
                let s = self.lookup(work.session.get())?;
                let refusable = |w: &RefWork| w.id == work && w.id.kind == WorkKind::Turn;
                if !s.works.iter().any(|w| refusable(w) && !w.start_refused) {
                    return Ok(NoOp);
                }
                let s = self.s(work.session.get());
                if let Some(w) = s.works.iter_mut().find(|w| w.id == work) {
                    w.start_refused = true;
                }
                Ok(Applied)
            }
            Step::WorkEnded(work, _) | Step::WorkExited(work) => {
                let s = self.lookup(work.session.get())?;
                let Some(w) = s.works.iter().find(|w| w.id == work) else {
                    // A late report from an old work (G5's detach, a long
                    // finished turn): never applied to the current one.
                    return Ok(NoOp);
                };
                let outcome = match *step {
                    Step::WorkEnded(_, outcome) => outcome,
                    _ if w.cancel.is_some() => Outcome::Cancelled,
                    _ => Outcome::Failed,
                };
                let cancelled = w.cancel.is_some();
                let drained = self.drained();
                let shutting_down = self.shutdown.is_some();
                let s = self.s(work.session.get());
                if shutting_down && work.kind == WorkKind::Turn && s.running_at_shutdown {
                    s.running_at_shutdown = false;
                    if !drained && !cancelled {
                        if let Some(shutdown) = self.shutdown.as_mut() {
                            shutdown.summary.drained.push(work.session);
                        }
                    }
                }
                self.end_work(work, outcome);
                Ok(Applied)
            }
            Step::AgentFinished(id) => {
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                if !matches!(self.sessions[&id].state, State::Registered | State::Running) {
                    return Ok(NoOp);
                }
                // During the drain the descendants' running turns keep it (G9).
                let draining = self.shutdown.as_ref().is_some_and(|s| !s.drained);
                let s = self.s(id);
                s.intent = Some(Intent::Finished);
                s.state = if s.works.is_empty() {
                    State::Settled
                } else {
                    State::Cancelling
                };
                if !draining {
                    self.cancel_subtree(id, CancelMode::Immediate, EndReason::ParentFinished);
                }
                self.cancel_works(id, CancelMode::Immediate, false);
                self.fixpoint();
                Ok(Applied)
            }
            Step::Cancel(id, mode) => self.cancel(id, mode, EndReason::Cancelled),
            Step::Abandoned(id) => {
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                // During a shutdown the shutdown owns it (G9).
                if self.shutdown.is_some() {
                    return Ok(NoOp);
                }
                self.cancel(id, CancelMode::Immediate, EndReason::Cancelled)
            }
            Step::Delegate(from, to) => {
                self.to_use(from)?;
                self.to_use(to)?;
                let delegates = self.delegations.entry(from).or_default();
                if from == to || delegates.contains(&to) {
                    return Ok(NoOp);
                }
                delegates.push(to);
                Ok(Applied)
            }
            Step::LeaseLost => {
                self.lease_lost = true;
                self.handle(&Step::BeginShutdown {
                    drain: crate::strategies::Span::Ms(0),
                })?;
                self.handle(&Step::SkipDrain)?;
                if let Some(shutdown) = self.shutdown.as_mut() {
                    shutdown.summary.lease_lost = true;
                }
                Ok(Applied)
            }
            Step::UserClose(id) => self.cancel(id, CancelMode::Immediate, EndReason::UserClose),
            Step::CancelTurn(id) => {
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                match self.cancel_works(id, CancelMode::Immediate, true) {
                    0 => Ok(NoOp),
                    _ => Ok(Applied),
                }
            }
            Step::CancelWork(work) => {
                let id = work.session.get();
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                let settle_at = self.policy.settle.after(self.now);
                let s = self.s(id);
                match s.works.iter_mut().find(|w| w.id == work) {
                    Some(w) if w.cancel.is_none() => {
                        w.cancel = Some(CancelMode::Immediate);
                        w.settle_at = settle_at;
                        self.orders.push(Effect::CancelWork {
                            work,
                            mode: CancelMode::Immediate,
                        });
                        Ok(Applied)
                    }
                    _ => Ok(NoOp),
                }
            }
            Step::SetBudget(id, max_turns, max_tokens, wall) => {
                let s = self.to_use(id)?;
                if let Some(intent) = s.intent {
                    return Err(Error::Closing {
                        session: SessionId(id),
                        reason: intent.reason(s.last_outcome),
                    });
                }
                if !matches!(s.state, State::Registered | State::Running) {
                    return Err(wrong_state(id, s.state, "set a budget"));
                }
                let deadline = wall.map(|ms| now + ms);
                let s = self.s(id);
                s.budget = Some(RefBudget {
                    max_turns,
                    max_tokens,
                    deadline,
                    turns: 0,
                    tokens: 0,
                    exhausted: false,
                });
                s.budgeted = true;
                let mut below = vec![id];
                while let Some(at) = below.pop() {
                    let children: Vec<u64> = self
                        .sessions
                        .iter()
                        .filter(|(_, c)| c.parent == Some(at))
                        .map(|(c, _)| *c)
                        .collect();
                    for c in children {
                        self.s(c).budgeted = true;
                        below.push(c);
                    }
                }
                Ok(Applied)
            }
            Step::Usage(work, tokens) => {
                let id = work.session.get();
                if !self.to_end(id)? {
                    // A work's report about a finalized session: it is gone.
                    return Ok(NoOp);
                }
                if !self.sessions[&id].budgeted {
                    return Ok(Applied);
                }
                let owners = self.budget_owners(id);
                for &owner in &owners {
                    if let Some(b) = self.s(owner).budget.as_mut() {
                        b.tokens = b.tokens.saturating_add(tokens);
                    }
                }
                for owner in owners.into_iter().rev() {
                    let exceeded = self.sessions[&owner].budget.as_ref().is_some_and(|b| {
                        !b.exhausted && b.max_tokens.is_some_and(|max| b.tokens > max)
                    });
                    if exceeded {
                        self.exhaust(owner);
                    }
                }
                Ok(Applied)
            }
            Step::Withdraw(id) => {
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                let has_child = self.sessions.values().any(|c| c.parent == Some(id));
                let s = self.s(id);
                let pristine = s.state == State::Registered
                    && s.turns == s.entry_turns
                    && s.tasks == 0
                    && s.intent.is_none()
                    && !has_child;
                if !pristine {
                    return Err(wrong_state(
                        id,
                        s.state,
                        "withdraw a registration that was used",
                    ));
                }
                // As if it had never been registered: no order, no record;
                // its parent moves as after a child's finalize.
                self.sessions.remove(&id);
                self.delegations.remove(&id);
                self.forgotten.insert(id);
                self.fixpoint();
                Ok(Applied)
            }
            Step::CancelDescendants(id) => {
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                match self.cancel_subtree(id, CancelMode::Immediate, EndReason::Cancelled) {
                    0 => Ok(NoOp),
                    _ => Ok(Applied),
                }
            }
            Step::Hold(id, hold) => {
                self.to_use(id)?;
                self.s(id).holds[slot(hold)] += 1;
                self.record_holds(id);
                Ok(Applied)
            }
            Step::Release(id, hold) => {
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                let s = self.s(id);
                if s.holds[slot(hold)] == 0 {
                    return Ok(NoOp);
                }
                s.holds[slot(hold)] -= 1;
                if !s.held() && s.works.is_empty() {
                    s.idle_since = now;
                }
                self.record_holds(id);
                self.fixpoint();
                Ok(Applied)
            }
            Step::TransportAttached(id, close_on_disconnect) => {
                self.to_use(id)?;
                let s = self.s(id);
                s.transports += 1;
                s.close_on_disconnect |= close_on_disconnect;
                s.orphan_at = None;
                s.pending = None;
                Ok(Applied)
            }
            Step::TransportDetached(id) => {
                if !self.to_end(id)? {
                    return Ok(AlreadyFinalized);
                }
                let grace = self.policy.orphan_grace;
                let s = self.s(id);
                if s.transports == 0 {
                    return Ok(NoOp);
                }
                s.transports -= 1;
                if s.transports == 0 {
                    if s.close_on_disconnect {
                        s.pending = Some(EndReason::TransportClosed);
                        self.fixpoint();
                    } else if let Some(at) = grace.after(now) {
                        s.orphan_at = Some(at);
                    }
                }
                Ok(Applied)
            }
            Step::Sweep(sweep) => {
                let before = self.open_count();
                match sweep {
                    Sweep::Idle => self.reap_idle(),
                    Sweep::Lru => self.enforce_lru_cap(),
                    Sweep::Orphan => {
                        let mut due: Vec<(u64, u64)> = self
                            .sessions
                            .iter()
                            .filter_map(|(id, s)| s.orphan_at.map(|at| (at, *id)))
                            .filter(|(at, _)| *at <= now)
                            .collect();
                        due.sort_unstable();
                        for (_, id) in due {
                            self.orphan_due(id);
                        }
                    }
                }
                Ok(if self.open_count() < before {
                    Applied
                } else {
                    NoOp
                })
            }
            Step::BeginShutdown { drain } => self.begin_shutdown(drain, false),
            Step::SkipDrain => match &self.shutdown {
                Some(s) if !s.drained => {
                    self.end_drain();
                    Ok(Applied)
                }
                _ => Ok(NoOp),
            },
            Step::Tick { .. } | Step::Forget(_) => unreachable!("not an event"),
        }
    }

    /// A shutdown begins; with `handoff`, one that releases its idle
    /// sessions instead of finalizing them (SPEC §12).
    fn begin_shutdown(&mut self, drain: Span, handoff: bool) -> Result<Handled, Error> {
        let now = self.now;
        if self.shutdown.is_some() {
            return Ok(Handled::NoOp);
        }
        let mut shutdown = RefShutdown::default();
        shutdown.summary.handoff = handoff;
        self.shutdown = Some(shutdown);
        self.orders.push(Effect::FlushTranscripts);
        let intent = match handoff {
            true => Intent::HandOff,
            false => Intent::End(EndReason::Shutdown),
        };
        for s in self.sessions.values_mut() {
            if s.state != State::Finalized {
                s.intent.get_or_insert(intent);
                s.running_at_shutdown = s.state == State::Running && s.turn().is_some();
            }
        }
        self.fixpoint();
        if drain.is_zero() {
            self.end_drain();
        } else if let Some(shutdown) = self.shutdown.as_mut() {
            shutdown.drain_until = drain.after(now);
        }
        Ok(Handled::Applied)
    }

    /// The sessions to evict to make room under the LRU cap for one more
    /// of `scope` under `parent` (spared): only idle sessions of that scope
    /// (a registration in flight too: a burst at the cap is admitted, its
    /// sessions evicting each other as they commit); found before the new
    /// session exists; refused, changing nothing,
    /// without them; evicted once it is its parent's child (G1).
    fn room_for(&self, parent: Option<u64>, scope: u64) -> Result<Vec<u64>, Error> {
        let mut evict = Vec::new();
        if let Some(cap) = self.policy.lru_cap {
            let needed = (self.open_count() + 1).saturating_sub(cap);
            if needed > 0 {
                let mut victims: Vec<_> = self
                    .sessions
                    .iter()
                    .filter(|(id, s)| {
                        Some(**id) != parent && s.scope == scope && self.reclaimable(**id)
                    })
                    .map(|(id, s)| (s.idle_since, *id))
                    .collect();
                if victims.len() < needed {
                    return Err(Error::OverCapacity { cap });
                }
                victims.sort_unstable();
                evict.extend(victims.into_iter().take(needed).map(|(_, id)| id));
            }
        }
        Ok(evict)
    }

    /// `Cancel` and `UserClose`: descendants first, then the session itself.
    fn cancel(&mut self, id: u64, mode: CancelMode, reason: EndReason) -> Result<Handled, Error> {
        self.cancel_as(id, mode, reason, EndReason::Cancelled)
    }

    /// A cancel whose descendants end `descendants`.
    fn cancel_as(
        &mut self,
        id: u64,
        mode: CancelMode,
        reason: EndReason,
        descendants: EndReason,
    ) -> Result<Handled, Error> {
        if !self.to_end(id)? {
            return Ok(Handled::AlreadyFinalized);
        }
        if !matches!(self.sessions[&id].state, State::Registered | State::Running) {
            // G6: cancelled already, or its work is over.
            return Ok(Handled::NoOp);
        }
        // A close of a session a handoff would release: it is closed.
        let s = self.s(id);
        if s.intent == Some(Intent::HandOff) {
            s.intent = Some(Intent::End(reason));
        }
        // Graceful for the whole subtree, or immediate for it.
        self.cancel_subtree(id, mode, descendants);
        self.cancel_one(id, mode, reason);
        Ok(Handled::Applied)
    }

    /// The sessions from `id` up to its root that have a budget, nearest first.
    fn budget_owners(&self, id: u64) -> Vec<u64> {
        let mut owners = Vec::new();
        let mut at = Some(id);
        while let Some(s) = at.and_then(|a| self.sessions.get(&a)) {
            if s.budget.is_some() {
                owners.push(at.unwrap_or_default());
            }
            at = s.parent;
        }
        owners
    }

    /// A budget ran out: its subtree is cancelled and ends `budget_exhausted`.
    fn exhaust(&mut self, id: u64) {
        if let Some(b) = self.s(id).budget.as_mut() {
            b.exhausted = true;
        }
        let reason = EndReason::BudgetExhausted;
        let _ = self.cancel_as(id, CancelMode::Immediate, reason, reason);
    }
}

pub struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        strategies::policy().prop_map(Model::new).boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        strategies::step(state)
    }

    fn apply(mut state: Model, step: &Step) -> Model {
        state.apply(step);
        state
    }

    /// Keeps shrunk sequences meaningful: a registration names a new id, and
    /// every other step a session that was registered at some point.
    fn preconditions(state: &Model, step: &Step) -> bool {
        let known = |id: u64| {
            state.sessions.contains_key(&id)
                || state.forgotten.contains(&id)
                || state.handed_off.contains(&id)
        };
        match step {
            Step::Register { session, .. } => !known(*session),
            // A fresh id, or one the model knows (refused, or adopted back).
            Step::Adopt { session, .. } => *session >= state.next_id || known(*session),
            _ => step.session().is_none_or(known),
        }
    }
}
