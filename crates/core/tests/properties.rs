//! The guarantees of SPEC §3 as properties of random event sequences.
//!
//! A naive reference model of SPEC §2–5 (plain structs, linear scans, a
//! fixpoint instead of the core's upward cascade) generates the transitions
//! and predicts every session's state; the real [`Core`] is driven with the
//! same inputs on a shared fake clock, and after every step each guarantee is
//! checked by a helper named after it. Time is an input like any other:
//! `Tick { millis }` advances the clock and calls `handle_timeout(now)`.
//!
//! `SETTLE_PROPTEST_CASES` raises the number of cases (default 1,000).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;
use proptest::test_runner::Config;
use proptest_state_machine::{prop_state_machine, ReferenceStateMachine, StateMachineTest};
use settle_core::{
    CancelMode, Core, Effect, EndReason, Event, Hold, Outcome, Policy, SessionId, State, Sweep,
    WorkId,
};

// ===========================================================================
// The reference model
// ===========================================================================

/// The tunables, in whole milliseconds of the fake clock.
#[derive(Debug, Clone)]
struct RefPolicy {
    settle_ms: u64,
    idle_ttl_ms: Option<u64>,
    lru_cap: Option<usize>,
    orphan_ms: u64,
}

impl RefPolicy {
    fn to_policy(&self) -> Policy {
        Policy {
            settle_timeout: Duration::from_millis(self.settle_ms),
            idle_ttl: self.idle_ttl_ms.map(Duration::from_millis),
            lru_cap: self.lru_cap,
            orphan_grace: Duration::from_millis(self.orphan_ms),
        }
    }
}

#[derive(Debug, Clone, Default)]
struct RefWork {
    cancel: Option<CancelMode>,
    attached: bool,
    closed: bool,
    close_sent: bool,
}

impl RefWork {
    fn stream_open_unclosed(&self) -> bool {
        self.attached && !self.closed && !self.close_sent
    }
}

#[derive(Debug, Clone)]
struct RefSession {
    parent: Option<u64>,
    state: State,
    work: Option<RefWork>,
    /// Why it will be (or was) finalized, once decided.
    closing: Option<EndReason>,
    holds: [u32; 2],
    transports: u32,
    close_on_disconnect: bool,
    close_pending: bool,
    idle_since: u64,
    settle_at: Option<u64>,
    orphan_at: Option<u64>,
    last_outcome: Option<Outcome>,
    turns: u32,
}

impl RefSession {
    fn held(&self) -> bool {
        self.holds.iter().any(|h| *h > 0)
    }
}

#[derive(Debug, Clone)]
struct Model {
    policy: RefPolicy,
    now: u64,
    sessions: BTreeMap<u64, RefSession>,
    /// `Some(drained)` once shutdown began.
    shutdown: Option<bool>,
    drain_at: Option<u64>,
    /// Whether the core should have accepted the last input (`Ok`).
    accepted: bool,
}

fn hold_slot(hold: Hold) -> usize {
    match hold {
        Hold::PendingInput => 0,
        Hold::Delegation => 1,
    }
}

impl Model {
    fn new(policy: RefPolicy) -> Self {
        Model {
            policy,
            now: 0,
            sessions: BTreeMap::new(),
            shutdown: None,
            drain_at: None,
            accepted: true,
        }
    }

    fn s(&mut self, id: u64) -> &mut RefSession {
        self.sessions.get_mut(&id).expect("a known session")
    }

    fn drained(&self) -> bool {
        self.shutdown == Some(true)
    }

    fn children(&self, id: u64) -> impl Iterator<Item = &RefSession> {
        self.sessions.values().filter(move |c| c.parent == Some(id))
    }

    fn unsettled_children(&self, id: u64) -> usize {
        self.children(id).filter(|c| c.state.is_open()).count()
    }

    fn unfinalized_children(&self, id: u64) -> usize {
        self.children(id)
            .filter(|c| c.state != State::Finalized)
            .count()
    }

    fn open_count(&self) -> usize {
        self.sessions
            .values()
            .filter(|s| s.state != State::Finalized)
            .count()
    }

    /// Every descendant of `id`, each listed after all of its own descendants.
    fn descendants_bottom_up(&self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        for (&c, _) in self.sessions.iter().filter(|(_, s)| s.parent == Some(id)) {
            out.extend(self.descendants_bottom_up(c));
            out.push(c);
        }
        out
    }

    fn all_bottom_up(&self) -> Vec<u64> {
        let mut out = Vec::new();
        for (&r, _) in self.sessions.iter().filter(|(_, s)| s.parent.is_none()) {
            out.extend(self.descendants_bottom_up(r));
            out.push(r);
        }
        out
    }

    /// SPEC §5: registered, no turn, not closing, no hold, and (G1) nothing
    /// below it still to be finalized.
    fn reclaimable(&self, id: u64) -> bool {
        let s = &self.sessions[&id];
        s.state == State::Registered
            && s.work.is_none()
            && s.closing.is_none()
            && !s.held()
            && self.unfinalized_children(id) == 0
    }

    /// Settle and finalize whatever may be, until nothing moves. The core
    /// walks up from what changed; the model just looks at everything.
    fn fixpoint(&mut self) {
        loop {
            let mut changed = false;
            let ids: Vec<u64> = self.sessions.keys().copied().collect();
            for id in ids {
                let unsettled = self.unsettled_children(id);
                let unfinalized = self.unfinalized_children(id);
                let drained = self.drained();
                let s = self.s(id);
                if s.state == State::Cancelling && s.work.is_none() && unsettled == 0 {
                    s.state = State::Settled;
                    changed = true;
                }
                let finalizable = s.work.is_none()
                    && unfinalized == 0
                    && s.closing.is_some()
                    && match s.state {
                        State::Settled => true,
                        // A held session is spared until the drain ends.
                        State::Registered => !s.held() || drained,
                        _ => false,
                    };
                if finalizable {
                    s.state = State::Finalized;
                    s.settle_at = None;
                    s.orphan_at = None;
                    changed = true;
                }
            }
            if !changed {
                break;
            }
        }
    }

    fn claim(&mut self, id: u64, reason: EndReason) -> bool {
        if self.shutdown.is_some() || !self.reclaimable(id) {
            return false;
        }
        self.s(id).closing = Some(reason);
        self.fixpoint();
        true
    }

    /// Ask one registered or running session to stop (its subtree is the
    /// caller's business).
    fn cancel_one(&mut self, id: u64, mode: CancelMode, reason: EndReason) {
        let now = self.now;
        let settle = self.policy.settle_ms;
        let s = self.s(id);
        if !matches!(s.state, State::Registered | State::Running) {
            return;
        }
        // SPEC §4 end reasons say what happened: an explicit cancel, close or
        // finish beats the blanket `shutdown` intent set at the start of the
        // drain (the same rule the core applies to `AgentFinished`).
        if matches!(s.closing, None | Some(EndReason::Shutdown)) {
            s.closing = Some(reason);
        }
        if let Some(w) = s.work.as_mut() {
            if w.cancel.is_none() {
                w.cancel = Some(mode);
            }
            if mode == CancelMode::Immediate && w.stream_open_unclosed() {
                w.close_sent = true;
            }
            if s.settle_at.is_none() {
                s.settle_at = Some(now + settle);
            }
        }
        s.state = State::Cancelling;
        self.fixpoint();
    }

    fn cancel_subtree(&mut self, id: u64, reason: EndReason) -> usize {
        let mut n = 0;
        for d in self.descendants_bottom_up(id) {
            if matches!(self.sessions[&d].state, State::Registered | State::Running) {
                self.cancel_one(d, CancelMode::Immediate, reason);
                n += 1;
            }
        }
        self.fixpoint();
        n
    }

    /// A turn ended, a hold was released or a transport dropped: a pending
    /// close-on-disconnect claim may go now.
    fn after_idle(&mut self, id: u64) {
        let s = &self.sessions[&id];
        if s.close_pending && s.transports == 0 && self.reclaimable(id) {
            self.s(id).close_pending = false;
            self.claim(id, EndReason::TransportClosed);
        }
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
            let Some((_, id)) = victim else { break };
            self.claim(id, EndReason::LruEvict);
        }
    }

    fn reap_idle(&mut self) {
        let Some(ttl) = self.policy.idle_ttl_ms else {
            return;
        };
        if self.shutdown.is_some() {
            return;
        }
        loop {
            let due = self
                .sessions
                .iter()
                .filter(|(id, s)| s.idle_since + ttl <= self.now && self.reclaimable(**id))
                .map(|(id, s)| (s.idle_since, *id))
                .min();
            let Some((_, id)) = due else { break };
            self.claim(id, EndReason::IdleReap);
        }
    }

    fn orphan_due(&mut self, id: u64) {
        let s = self.s(id);
        s.orphan_at = None;
        if s.transports > 0 || s.state.rank() >= State::Settled.rank() {
            return;
        }
        if !self.claim(id, EndReason::OrphanReap) {
            let now = self.now + self.policy.orphan_ms;
            let s = self.s(id);
            // Skipped because it is live or held: re-armed (SPEC §5).
            if s.state.is_open() && s.closing.is_none() {
                s.orphan_at = Some(now);
            }
        }
    }

    /// G5: the cancelled work had its chance; it is abandoned.
    fn settle_due(&mut self, id: u64) {
        let now = self.now;
        let s = self.s(id);
        s.settle_at = None;
        if s.work.take().is_none() {
            return;
        }
        s.last_outcome = Some(Outcome::Detached);
        if s.state == State::Running {
            // Only its turn was cancelled: the session goes on.
            s.state = State::Registered;
            s.idle_since = now;
            self.after_idle(id);
        } else {
            self.fixpoint();
        }
    }

    fn end_drain(&mut self) {
        if self.shutdown.is_none() {
            return;
        }
        self.shutdown = Some(true);
        self.drain_at = None;
        for id in self.all_bottom_up() {
            if self.sessions[&id].state == State::Running {
                self.cancel_one(id, CancelMode::Immediate, EndReason::Shutdown);
            }
        }
        self.fixpoint();
    }

    fn handle_timeout(&mut self) {
        if self.drain_at.is_some_and(|at| at <= self.now) {
            self.end_drain();
        }
        // Deadlines in the order of the one deadline table: by time, then
        // session, settle before orphan.
        loop {
            let next = self
                .sessions
                .iter()
                .flat_map(|(id, s)| {
                    [
                        s.settle_at.map(|at| (at, *id, 0)),
                        s.orphan_at.map(|at| (at, *id, 1)),
                    ]
                })
                .flatten()
                .filter(|(at, _, _)| *at <= self.now)
                .min();
            match next {
                Some((_, id, 0)) => self.settle_due(id),
                Some((_, id, _)) => self.orphan_due(id),
                None => break,
            }
        }
        self.reap_idle();
    }

    /// `Err` for an unknown or finalized session.
    fn open(&self, id: u64) -> bool {
        self.sessions
            .get(&id)
            .is_some_and(|s| s.state != State::Finalized)
    }

    /// Applies one step; returns whether the core should accept it.
    fn step(&mut self, step: &Step) -> bool {
        let now = self.now;
        match *step {
            Step::Register { session, parent } => {
                if self.sessions.contains_key(&session) || self.shutdown.is_some() {
                    return false;
                }
                if let Some(p) = parent {
                    let ok = self.sessions.get(&p).is_some_and(|p| {
                        matches!(p.state, State::Registered | State::Running) && p.closing.is_none()
                    });
                    if !ok {
                        return false;
                    }
                }
                self.sessions.insert(
                    session,
                    RefSession {
                        parent,
                        state: State::Registered,
                        work: None,
                        closing: None,
                        holds: [0; 2],
                        transports: 0,
                        close_on_disconnect: false,
                        close_pending: false,
                        idle_since: now,
                        settle_at: None,
                        orphan_at: None,
                        last_outcome: None,
                        turns: 0,
                    },
                );
                self.enforce_lru_cap();
                true
            }
            Step::StartTurn(id) => {
                if !self.open(id) || self.shutdown.is_some() {
                    return false;
                }
                let s = self.s(id);
                if s.closing.is_some() || s.state != State::Registered {
                    return false;
                }
                s.turns += 1;
                s.work = Some(RefWork::default());
                s.state = State::Running;
                true
            }
            Step::StreamAttached(id) => {
                if !self.open(id) {
                    return false;
                }
                if let Some(w) = self.s(id).work.as_mut() {
                    w.attached = true;
                    // Seed 001: the cancel landed before the stream attached.
                    if w.cancel == Some(CancelMode::Immediate) && w.stream_open_unclosed() {
                        w.close_sent = true;
                    }
                }
                true
            }
            Step::StreamClosed(id) => {
                if !self.open(id) {
                    return false;
                }
                if let Some(w) = self.s(id).work.as_mut() {
                    w.closed = true;
                }
                true
            }
            Step::TurnEnded(id, outcome) => self.work_ended(id, Some(outcome)),
            Step::WorkExited(id) => self.work_ended(id, None),
            Step::AgentFinished(id) => {
                if !self.open(id) {
                    return false;
                }
                let s = self.s(id);
                if !matches!(s.state, State::Registered | State::Running) {
                    return true;
                }
                if s.work.take().is_some() {
                    s.last_outcome = Some(Outcome::Completed);
                    s.settle_at = None;
                }
                let reason = match s.last_outcome {
                    None | Some(Outcome::Completed) => EndReason::Completed,
                    Some(_) => EndReason::Failed,
                };
                if matches!(s.closing, None | Some(EndReason::Shutdown)) {
                    s.closing = Some(reason);
                }
                // Its own work is over: it settles, then its subtree winds
                // down, and it is finalized after all of it (G1).
                s.state = State::Settled;
                self.cancel_subtree(id, EndReason::ParentFinished);
                true
            }
            Step::Cancel(id, mode) => self.cancel(id, mode, EndReason::Cancelled),
            Step::UserClose(id) => self.cancel(id, CancelMode::Immediate, EndReason::UserClose),
            Step::CancelTurn(id) => {
                if !self.open(id) {
                    return false;
                }
                let settle = self.policy.settle_ms;
                let s = self.s(id);
                if let Some(w) = s.work.as_mut() {
                    if w.cancel.is_none() {
                        w.cancel = Some(CancelMode::Immediate);
                        w.close_sent |= w.stream_open_unclosed();
                        s.settle_at = Some(now + settle);
                    }
                }
                true
            }
            Step::CancelDescendants(id) => {
                if !self.sessions.contains_key(&id) {
                    return false;
                }
                if self.open(id) {
                    self.cancel_subtree(id, EndReason::Cancelled);
                }
                true
            }
            Step::Hold(id, hold) => {
                if !self.open(id) {
                    return false;
                }
                self.s(id).holds[hold_slot(hold)] += 1;
                self.after_idle(id);
                true
            }
            Step::Release(id, hold) => {
                if !self.open(id) {
                    return false;
                }
                let s = self.s(id);
                let slot = &mut s.holds[hold_slot(hold)];
                if *slot == 0 {
                    return true;
                }
                *slot -= 1;
                if !s.held() && s.work.is_none() {
                    s.idle_since = now;
                }
                self.after_idle(id);
                true
            }
            Step::TransportAttached(id, close_on_disconnect) => {
                if !self.open(id) {
                    return false;
                }
                let s = self.s(id);
                s.transports += 1;
                s.close_on_disconnect |= close_on_disconnect;
                s.orphan_at = None;
                true
            }
            Step::TransportDetached(id) => {
                if !self.open(id) {
                    return false;
                }
                let grace = self.policy.orphan_ms;
                let s = self.s(id);
                if s.transports == 0 {
                    return true;
                }
                s.transports -= 1;
                if s.transports > 0 {
                    return true;
                }
                if s.close_on_disconnect {
                    s.close_pending = true;
                    self.after_idle(id);
                } else {
                    s.orphan_at = Some(now + grace);
                }
                true
            }
            Step::Sweep(Sweep::Idle) => {
                self.reap_idle();
                true
            }
            Step::Sweep(Sweep::Lru) => {
                self.enforce_lru_cap();
                true
            }
            Step::Sweep(Sweep::Orphan) => {
                let due: Vec<u64> = self
                    .sessions
                    .iter()
                    .filter(|(_, s)| s.orphan_at.is_some_and(|at| at <= now))
                    .map(|(id, _)| *id)
                    .collect();
                for id in due {
                    self.orphan_due(id);
                }
                true
            }
            Step::BeginShutdown { drain_ms } => {
                if self.shutdown.is_some() {
                    return true;
                }
                self.shutdown = Some(false);
                for s in self.sessions.values_mut() {
                    if s.state != State::Finalized {
                        s.closing.get_or_insert(EndReason::Shutdown);
                    }
                }
                self.fixpoint();
                if drain_ms == 0 {
                    self.end_drain();
                } else {
                    self.drain_at = Some(now + drain_ms);
                }
                true
            }
            Step::SkipDrain => {
                if self.shutdown == Some(false) {
                    self.end_drain();
                }
                true
            }
            Step::Tick { millis } => {
                self.now += millis;
                self.handle_timeout();
                true
            }
        }
    }

    fn work_ended(&mut self, id: u64, outcome: Option<Outcome>) -> bool {
        if !self.open(id) {
            return false;
        }
        let now = self.now;
        let s = self.s(id);
        let Some(w) = s.work.take() else {
            return true;
        };
        let outcome = outcome.unwrap_or(if w.cancel.is_some() {
            Outcome::Cancelled
        } else {
            Outcome::Failed
        });
        s.last_outcome = Some(outcome);
        s.settle_at = None;
        if s.state == State::Running {
            s.state = State::Registered;
            s.idle_since = now;
            self.after_idle(id);
        } else {
            self.fixpoint();
        }
        true
    }

    fn cancel(&mut self, id: u64, mode: CancelMode, reason: EndReason) -> bool {
        let Some(s) = self.sessions.get(&id) else {
            return false;
        };
        if !matches!(s.state, State::Registered | State::Running) {
            return true;
        }
        self.cancel_subtree(id, EndReason::Cancelled);
        self.cancel_one(id, mode, reason);
        true
    }
}

/// One generated input.
#[derive(Debug, Clone)]
enum Step {
    Register { session: u64, parent: Option<u64> },
    StartTurn(u64),
    StreamAttached(u64),
    StreamClosed(u64),
    TurnEnded(u64, Outcome),
    WorkExited(u64),
    AgentFinished(u64),
    Cancel(u64, CancelMode),
    CancelTurn(u64),
    CancelDescendants(u64),
    UserClose(u64),
    Hold(u64, Hold),
    Release(u64, Hold),
    TransportAttached(u64, bool),
    TransportDetached(u64),
    Sweep(Sweep),
    BeginShutdown { drain_ms: u64 },
    SkipDrain,
    Tick { millis: u64 },
}

impl Step {
    fn session(&self) -> Option<u64> {
        match *self {
            Step::StartTurn(id)
            | Step::StreamAttached(id)
            | Step::StreamClosed(id)
            | Step::TurnEnded(id, _)
            | Step::WorkExited(id)
            | Step::AgentFinished(id)
            | Step::Cancel(id, _)
            | Step::CancelTurn(id)
            | Step::CancelDescendants(id)
            | Step::UserClose(id)
            | Step::Hold(id, _)
            | Step::Release(id, _)
            | Step::TransportAttached(id, _)
            | Step::TransportDetached(id) => Some(id),
            _ => None,
        }
    }

    fn event(&self) -> Option<Event> {
        let sid = SessionId;
        Some(match *self {
            Step::Register { session, parent } => Event::Register {
                session: sid(session),
                parent: parent.map(sid),
            },
            Step::StartTurn(id) => Event::StartTurn { session: sid(id) },
            Step::StreamAttached(id) => Event::StreamAttached { session: sid(id) },
            Step::StreamClosed(id) => Event::StreamClosed { session: sid(id) },
            Step::TurnEnded(id, outcome) => Event::TurnEnded {
                session: sid(id),
                outcome,
            },
            Step::WorkExited(id) => Event::WorkExited { session: sid(id) },
            Step::AgentFinished(id) => Event::AgentFinished { session: sid(id) },
            Step::Cancel(id, mode) => Event::Cancel {
                session: sid(id),
                mode,
            },
            Step::CancelTurn(id) => Event::CancelTurn { session: sid(id) },
            Step::CancelDescendants(id) => Event::CancelDescendants { session: sid(id) },
            Step::UserClose(id) => Event::UserClose { session: sid(id) },
            Step::Hold(id, hold) => Event::Hold {
                session: sid(id),
                hold,
            },
            Step::Release(id, hold) => Event::Release {
                session: sid(id),
                hold,
            },
            Step::TransportAttached(id, close_on_disconnect) => Event::TransportAttached {
                session: sid(id),
                close_on_disconnect,
            },
            Step::TransportDetached(id) => Event::TransportDetached { session: sid(id) },
            Step::Sweep(sweep) => Event::Sweep(sweep),
            Step::BeginShutdown { drain_ms } => Event::BeginShutdown {
                drain: Duration::from_millis(drain_ms),
            },
            Step::SkipDrain => Event::SkipDrain,
            Step::Tick { .. } => return None,
        })
    }
}

struct Reference;

impl ReferenceStateMachine for Reference {
    type State = Model;
    type Transition = Step;

    fn init_state() -> BoxedStrategy<Model> {
        (
            select(vec![1u64, 50, 200]),
            select(vec![None, Some(300u64), Some(1500)]),
            select(vec![None, Some(3usize), Some(6)]),
            select(vec![100u64, 700]),
        )
            .prop_map(|(settle_ms, idle_ttl_ms, lru_cap, orphan_ms)| {
                Model::new(RefPolicy {
                    settle_ms,
                    idle_ttl_ms,
                    lru_cap,
                    orphan_ms,
                })
            })
            .boxed()
    }

    fn transitions(state: &Model) -> BoxedStrategy<Step> {
        let next = state.sessions.keys().max().map_or(1, |m| m + 1);
        let ids = |keep: &dyn Fn(&RefSession) -> bool| -> Vec<u64> {
            state
                .sessions
                .iter()
                .filter(|(_, s)| keep(s))
                .map(|(id, _)| *id)
                .collect()
        };
        let all = ids(&|_| true);
        let open = ids(&|s| s.state != State::Finalized);
        let idle = ids(&|s| s.state == State::Registered && s.closing.is_none());
        let busy = ids(&|s| s.work.is_some());

        let mut choices: Vec<(u32, BoxedStrategy<Step>)> = Vec::new();
        let tick = prop_oneof![
            3 => 0u64..=60,
            3 => 60u64..=400,
            1 => 400u64..=2500,
        ]
        .prop_map(|millis| Step::Tick { millis });
        choices.push((8, tick.boxed()));
        let sweep = prop_oneof![Just(Sweep::Idle), Just(Sweep::Lru), Just(Sweep::Orphan)];
        choices.push((2, sweep.prop_map(Step::Sweep).boxed()));
        // Rare, so that most sequences live a while before they shut down.
        let drain = prop_oneof![Just(0u64), 1u64..=600];
        choices.push((
            1,
            drain
                .prop_map(|drain_ms| Step::BeginShutdown { drain_ms })
                .boxed(),
        ));
        choices.push((1, Just(Step::SkipDrain).boxed()));

        // A parent that can take children, one that may not, or one that does
        // not exist: the last two are refused whole.
        let mut parents: Vec<(u32, BoxedStrategy<Option<u64>>)> = vec![
            (3, Just(None).boxed()),
            (1, Just(Some(next + 1000)).boxed()),
        ];
        let live = ids(&|s| matches!(s.state, State::Registered | State::Running));
        if !live.is_empty() {
            parents.push((8, select(live).prop_map(Some).boxed()));
        }
        if !all.is_empty() {
            parents.push((1, select(all.clone()).prop_map(Some).boxed()));
        }
        let register = Union::new_weighted(parents).prop_map(move |parent| Step::Register {
            session: next,
            parent,
        });
        // After shutdown one refusal is telling; a run of them is not.
        let register_weight = if state.shutdown.is_some() { 1 } else { 14 };
        choices.push((register_weight, register.boxed()));

        let outcome = prop_oneof![
            3 => Just(Outcome::Completed),
            1 => Just(Outcome::Failed),
            1 => Just(Outcome::IdleTimeout),
            1 => Just(Outcome::Cancelled),
        ];
        let mode = prop_oneof![Just(CancelMode::Graceful), Just(CancelMode::Immediate)];
        let hold = prop_oneof![Just(Hold::PendingInput), Just(Hold::Delegation)];

        if !idle.is_empty() {
            choices.push((10, select(idle).prop_map(Step::StartTurn).boxed()));
        }
        if !busy.is_empty() {
            let b = || select(busy.clone());
            choices.push((4, b().prop_map(Step::StreamAttached).boxed()));
            choices.push((2, b().prop_map(Step::StreamClosed).boxed()));
            choices.push((
                4,
                (b(), outcome)
                    .prop_map(|(id, o)| Step::TurnEnded(id, o))
                    .boxed(),
            ));
            choices.push((2, b().prop_map(Step::WorkExited).boxed()));
            choices.push((2, b().prop_map(Step::CancelTurn).boxed()));
        }
        if !open.is_empty() {
            let o = || select(open.clone());
            choices.push((2, o().prop_map(Step::AgentFinished).boxed()));
            choices.push((
                2,
                (o(), mode).prop_map(|(id, m)| Step::Cancel(id, m)).boxed(),
            ));
            choices.push((1, o().prop_map(Step::CancelDescendants).boxed()));
            choices.push((1, o().prop_map(Step::UserClose).boxed()));
            choices.push((
                2,
                (o(), hold.clone())
                    .prop_map(|(id, h)| Step::Hold(id, h))
                    .boxed(),
            ));
            choices.push((
                2,
                (o(), hold).prop_map(|(id, h)| Step::Release(id, h)).boxed(),
            ));
            let cod = prop_oneof![3 => Just(false), 1 => Just(true)];
            choices.push((
                3,
                (o(), cod)
                    .prop_map(|(id, c)| Step::TransportAttached(id, c))
                    .boxed(),
            ));
            choices.push((3, o().prop_map(Step::TransportDetached).boxed()));
        }
        if !all.is_empty() {
            // Any event at any session, finalized ones included: refusals
            // (G10) and no-ops must change nothing either.
            let outcome = prop_oneof![Just(Outcome::Completed), Just(Outcome::Failed)];
            let any_event = (select(all), outcome, any::<bool>(), 0u8..14).prop_map(
                |(id, outcome, flag, which)| match which {
                    0 => Step::StartTurn(id),
                    1 => Step::StreamAttached(id),
                    2 => Step::StreamClosed(id),
                    3 => Step::TurnEnded(id, outcome),
                    4 => Step::WorkExited(id),
                    5 => Step::AgentFinished(id),
                    6 => Step::Cancel(id, CancelMode::Immediate),
                    7 => Step::CancelTurn(id),
                    8 => Step::CancelDescendants(id),
                    9 => Step::UserClose(id),
                    10 => Step::Hold(id, Hold::Delegation),
                    11 => Step::Release(id, Hold::Delegation),
                    12 => Step::TransportAttached(id, flag),
                    _ => Step::TransportDetached(id),
                },
            );
            choices.push((3, any_event.boxed()));
        }
        Union::new_weighted(choices).boxed()
    }

    fn apply(mut state: Model, step: &Step) -> Model {
        state.accepted = state.step(step);
        state
    }

    fn preconditions(state: &Model, step: &Step) -> bool {
        // Keeps shrunk sequences meaningful: ids refer to registered sessions
        // (or, for a register, are new).
        match step {
            Step::Register { session, .. } => !state.sessions.contains_key(session),
            _ => step
                .session()
                .is_none_or(|id| state.sessions.contains_key(&id)),
        }
    }
}

// ===========================================================================
// The system under test, with what it has been observed to do
// ===========================================================================

struct Sut {
    core: Core,
    base: Instant,
    now_ms: u64,
    settle_ms: u64,
    parents: HashMap<u64, Option<u64>>,
    /// Each session's state as told by its `Transition` effects.
    timeline: HashMap<u64, State>,
    finalizes: HashMap<u64, usize>,
    cancels: HashMap<WorkId, u64>,
    closes: HashMap<WorkId, usize>,
    attached: HashSet<WorkId>,
    closed_by_work: HashSet<WorkId>,
    ended: HashSet<WorkId>,
    /// Holds by session and kind, as accepted by the core.
    holds: HashMap<(u64, usize), u32>,
    /// The state each finalized session was in just before.
    finalized_from: HashMap<u64, State>,
    flushed: HashSet<u64>,
    open_at_shutdown: HashSet<u64>,
    shutdown_completes: usize,
}

impl Sut {
    fn at(&self) -> Instant {
        self.base + Duration::from_millis(self.now_ms)
    }

    fn work_of(&self, id: u64) -> Option<WorkId> {
        self.core.session(SessionId(id)).and_then(|s| s.work())
    }

    fn state_of(&self, id: u64) -> Option<State> {
        self.core.session(SessionId(id)).map(|s| s.state())
    }

    fn held(&self, id: u64) -> bool {
        self.holds.iter().any(|((s, _), n)| *s == id && *n > 0)
    }

    fn descendants(&self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut stack = vec![id];
        while let Some(p) = stack.pop() {
            for (c, _) in self.parents.iter().filter(|(_, pp)| **pp == Some(p)) {
                out.push(*c);
                stack.push(*c);
            }
        }
        out
    }
}

struct CoreUnderTest;

impl StateMachineTest for CoreUnderTest {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(model: &Model) -> Sut {
        Sut {
            core: Core::new(model.policy.to_policy()),
            base: Instant::now(),
            now_ms: 0,
            settle_ms: model.policy.settle_ms,
            parents: HashMap::new(),
            timeline: HashMap::new(),
            finalizes: HashMap::new(),
            cancels: HashMap::new(),
            closes: HashMap::new(),
            attached: HashSet::new(),
            closed_by_work: HashSet::new(),
            ended: HashSet::new(),
            holds: HashMap::new(),
            finalized_from: HashMap::new(),
            flushed: HashSet::new(),
            open_at_shutdown: HashSet::new(),
            shutdown_completes: 0,
        }
    }

    fn apply(mut sut: Sut, model: &Model, step: Step) -> Sut {
        let ids: Vec<u64> = sut.parents.keys().copied().collect();
        let works_before: HashMap<u64, WorkId> = ids
            .iter()
            .filter_map(|id| sut.work_of(*id).map(|w| (*id, w)))
            .collect();
        let states_before: HashMap<u64, State> = ids
            .iter()
            .filter_map(|id| sut.state_of(*id).map(|s| (*id, s)))
            .collect();
        let cancel_before = step.session().and_then(|id| {
            sut.core
                .session(SessionId(id))
                .and_then(|s| s.work_cancel())
        });
        let was_shutting_down = sut.core.is_shutting_down();

        let accepted = match step.event() {
            Some(event) => {
                let at = sut.at();
                sut.core.handle(at, event).is_ok()
            }
            None => {
                let Step::Tick { millis } = step else {
                    unreachable!()
                };
                sut.now_ms += millis;
                let at = sut.at();
                sut.core.handle_timeout(at);
                true
            }
        };
        let mut effects = Vec::new();
        while let Some(e) = sut.core.poll_effect() {
            effects.push(e);
        }

        assert_eq!(
            accepted, model.accepted,
            "the core and the model disagree on accepting {step:?}"
        );
        if accepted {
            match step {
                Step::Register { session, parent } => {
                    sut.parents.insert(session, parent);
                }
                Step::Hold(id, hold) => *sut.holds.entry((id, hold_slot(hold))).or_default() += 1,
                Step::Release(id, hold) => {
                    let h = sut.holds.entry((id, hold_slot(hold))).or_default();
                    *h = h.saturating_sub(1);
                }
                Step::StreamAttached(id) => {
                    if let Some(w) = works_before.get(&id) {
                        sut.attached.insert(*w);
                    }
                }
                Step::StreamClosed(id) => {
                    if let Some(w) = works_before.get(&id) {
                        sut.closed_by_work.insert(*w);
                    }
                }
                _ => {}
            }
        }
        if !was_shutting_down && sut.core.is_shutting_down() {
            sut.open_at_shutdown = states_before
                .iter()
                .filter(|(_, s)| **s != State::Finalized)
                .map(|(id, _)| *id)
                .collect();
        }

        g9_nothing_new_starts_after_shutdown_began(was_shutting_down, &step, accepted);
        for effect in &effects {
            transitions_follow_the_timeline(&mut sut, effect);
            g1_finalize_effects_come_children_first(&sut, effect);
            g2_each_session_is_finalized_at_most_once(&mut sut, effect);
            g3_no_reclaim_of_a_live_held_or_finalized_session(&sut, effect);
            g4_each_stream_is_closed_at_most_once(&mut sut, effect);
            g6_no_duplicate_or_late_cancel(&mut sut, &works_before, effect);
            g9_no_finalize_while_the_work_can_write(&mut sut, effect);
            end_hook_flags_match_the_last_outcome(&sut, effect);
        }
        g4_a_stream_attached_after_an_immediate_cancel_is_closed(
            &sut,
            &step,
            accepted,
            cancel_before,
            &works_before,
        );

        // Works that are gone now have ended: no cancel may name them again.
        for (id, w) in &works_before {
            if sut.work_of(*id) != Some(*w) {
                sut.ended.insert(*w);
            }
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        states_never_move_backwards_and_match_the_model(sut, model);
        g1_no_finalized_session_has_an_unfinalized_descendant(sut);
        g5_every_cancelled_work_settles_by_its_deadline(sut);
        g9_shutdown_completes_once_every_work_is_gone(sut);
        session_views_match_the_model(sut, model);
    }
}

// ===========================================================================
// The guarantees, one helper each
// ===========================================================================

/// Every `Transition` starts where the last one left the session, and states
/// only move forward (but for `running → registered` when a turn ends).
fn transitions_follow_the_timeline(sut: &mut Sut, effect: &Effect) {
    let Effect::Transition(t) = effect else {
        return;
    };
    let id = t.session.get();
    let known = sut.timeline.get(&id).copied();
    assert_eq!(
        t.from, known,
        "transition {t:?} does not start where the timeline left session {id}"
    );
    if let Some(from) = t.from {
        let allowed_back = from == State::Running && t.to == State::Registered;
        assert!(
            t.to.rank() >= from.rank() || allowed_back,
            "session {id} moved backwards: {from} → {}",
            t.to
        );
        assert_ne!(from, State::Finalized, "finalized is terminal");
    }
    assert_eq!(t.at, sut.at(), "transitions carry the input's time");
    if let (Some(from), State::Finalized) = (t.from, t.to) {
        sut.finalized_from.insert(id, from);
    }
    sut.timeline.insert(id, t.to);
}

fn states_never_move_backwards_and_match_the_model(sut: &Sut, model: &Model) {
    for (id, expected) in &model.sessions {
        let view = sut
            .core
            .session(SessionId(*id))
            .unwrap_or_else(|| panic!("session {id} is known to the model, not to the core"));
        assert_eq!(
            view.state(),
            expected.state,
            "session {id}: the core says {}, the model {}\nmodel: {expected:?}",
            view.state(),
            expected.state
        );
        assert_eq!(
            sut.timeline.get(id),
            Some(&view.state()),
            "session {id}: the timeline disagrees with the state"
        );
        assert_eq!(view.turns(), expected.turns, "session {id}: turns");
        assert_eq!(
            view.last_outcome(),
            expected.last_outcome,
            "session {id}: last outcome"
        );
        assert_eq!(
            view.work().is_some(),
            expected.work.is_some(),
            "session {id}: work"
        );
        if expected.state == State::Finalized {
            assert_eq!(view.closing(), expected.closing, "session {id}: end reason");
        }
    }
    assert_eq!(sut.core.sessions().count(), model.sessions.len());
    assert_eq!(sut.core.is_drained(), model.drained());
}

/// Every accessor of a session's view, and the core's own counters, say what
/// the model says: parent and children, the cancel sent to its work, holds,
/// transports, the pending settle deadline.
fn session_views_match_the_model(sut: &Sut, model: &Model) {
    assert_eq!(sut.core.policy(), &model.policy.to_policy());
    assert_eq!(
        sut.core.open_sessions(),
        model.open_count(),
        "open sessions"
    );
    for (id, expected) in &model.sessions {
        let view = sut.core.session(SessionId(*id)).expect("known");
        assert_eq!(view.id(), SessionId(*id));
        assert_eq!(
            view.parent(),
            expected.parent.map(SessionId),
            "session {id}: parent"
        );
        let mut children: Vec<u64> = view.children().iter().map(|c| c.get()).collect();
        children.sort_unstable();
        let expected_children: Vec<u64> = model
            .sessions
            .iter()
            .filter(|(_, c)| c.parent == Some(*id))
            .map(|(c, _)| *c)
            .collect();
        assert_eq!(children, expected_children, "session {id}: children");
        assert_eq!(
            view.work_cancel(),
            expected.work.as_ref().and_then(|w| w.cancel),
            "session {id}: the cancel sent to its work"
        );
        assert_eq!(view.is_held(), expected.held(), "session {id}: held");
        assert_eq!(
            u32::from(view.transports()),
            expected.transports,
            "session {id}: transports"
        );
        assert_eq!(
            view.settle_deadline(),
            expected
                .settle_at
                .map(|ms| sut.base + Duration::from_millis(ms)),
            "session {id}: settle deadline"
        );
        assert_eq!(
            view.state().is_live(),
            matches!(expected.state, State::Running | State::Cancelling),
            "session {id}: is_live"
        );
    }
}

/// SPEC §4: the `completed` / `interrupted` flags of the `on_session_end` hook
/// follow the session's last outcome (seed 004): `completed` only after a
/// completed turn, `interrupted` only after one cut short from outside.
fn end_hook_flags_match_the_last_outcome(sut: &Sut, effect: &Effect) {
    let Effect::Finalize(f) = effect else { return };
    let view = sut.core.session(f.session).expect("known");
    assert_eq!(f.last_outcome, view.last_outcome(), "{f:?}");
    let completed = f.last_outcome == Some(Outcome::Completed);
    let interrupted = matches!(
        f.last_outcome,
        Some(Outcome::Cancelled | Outcome::Detached | Outcome::Interrupted)
    );
    assert_eq!(f.completed(), completed, "completed flag of {f:?}");
    assert_eq!(f.interrupted(), interrupted, "interrupted flag of {f:?}");
    assert!(!(f.completed() && f.interrupted()), "{f:?}");
}

/// G1, in effect order: a session is finalized only after all its children.
fn g1_finalize_effects_come_children_first(sut: &Sut, effect: &Effect) {
    let Effect::Finalize(f) = effect else { return };
    let id = f.session.get();
    for (c, _) in sut.parents.iter().filter(|(_, p)| **p == Some(id)) {
        assert!(
            sut.finalizes.get(c).copied().unwrap_or(0) == 1,
            "G1: session {id} finalized before its child {c}"
        );
    }
}

/// G1, in state: nothing below a finalized session is still open, let alone
/// running or cancelling.
fn g1_no_finalized_session_has_an_unfinalized_descendant(sut: &Sut) {
    for id in sut.parents.keys() {
        if sut.state_of(*id) != Some(State::Finalized) {
            continue;
        }
        for d in sut.descendants(*id) {
            let state = sut.state_of(d).expect("known");
            assert!(
                !state.is_live(),
                "G1: session {id} finalized while its descendant {d} is {state}"
            );
            assert_eq!(
                state,
                State::Finalized,
                "G1: session {id} finalized before its descendant {d}"
            );
        }
    }
}

fn g2_each_session_is_finalized_at_most_once(sut: &mut Sut, effect: &Effect) {
    let Effect::Finalize(f) = effect else { return };
    let n = sut.finalizes.entry(f.session.get()).or_default();
    *n += 1;
    assert_eq!(*n, 1, "G2: session {} finalized twice", f.session);
}

/// G3: a reclaim takes only an idle registered session (or, for the shutdown
/// sweep, one that has settled), never a held one before the drain ended.
fn g3_no_reclaim_of_a_live_held_or_finalized_session(sut: &Sut, effect: &Effect) {
    let Effect::Finalize(f) = effect else { return };
    if !f.reason.is_reclaim() {
        return;
    }
    let id = f.session.get();
    // The transition just before it says what the session was at the claim.
    let from = sut.timeline.get(&id).copied();
    assert_eq!(
        from,
        Some(State::Finalized),
        "the transition precedes the plan"
    );
    assert_eq!(
        sut.finalizes.get(&id).copied(),
        Some(1),
        "G3: reclaim of an already finalized session {id}"
    );
    let from = sut.finalized_from.get(&id).copied();
    match from {
        Some(State::Registered) => {}
        // A session running when the drain ended was cancelled, settled,
        // and is then finalized by the shutdown (G9).
        Some(State::Settled) if f.reason == EndReason::Shutdown => {}
        other => panic!("G3: {} reclaim of session {id} from {other:?}", f.reason),
    }
    let held = sut.held(id);
    if f.reason == EndReason::Shutdown {
        assert!(
            !held || sut.core.is_drained(),
            "G3: held session {id} reclaimed by shutdown before the drain ended"
        );
    } else {
        assert!(!held, "G3: held session {id} reclaimed ({})", f.reason);
        assert!(
            !sut.core.is_shutting_down(),
            "G3: {} reclaim during shutdown",
            f.reason
        );
    }
}

fn g4_each_stream_is_closed_at_most_once(sut: &mut Sut, effect: &Effect) {
    match effect {
        Effect::CloseStream { work } => {
            let n = sut.closes.entry(*work).or_default();
            *n += 1;
            assert_eq!(*n, 1, "G4: stream of {work:?} closed twice");
        }
        // A detached work's open stream is force-closed first.
        Effect::DetachWork { work }
            if sut.attached.contains(work) && !sut.closed_by_work.contains(work) =>
        {
            assert_eq!(
                sut.closes.get(work).copied(),
                Some(1),
                "G4: {work:?} detached with its stream open"
            );
        }
        _ => {}
    }
}

/// G4, seed 001: the cancel landed before the stream attached.
fn g4_a_stream_attached_after_an_immediate_cancel_is_closed(
    sut: &Sut,
    step: &Step,
    accepted: bool,
    cancel_before: Option<CancelMode>,
    works_before: &HashMap<u64, WorkId>,
) {
    let Step::StreamAttached(id) = *step else {
        return;
    };
    let Some(work) = works_before.get(&id) else {
        return;
    };
    if !accepted || cancel_before != Some(CancelMode::Immediate) {
        return;
    }
    if sut.closed_by_work.contains(work) {
        return;
    }
    let closed = sut.closes.get(work).copied().unwrap_or(0);
    assert_eq!(closed, 1, "G4: late stream of {work:?} not closed");
}

fn g6_no_duplicate_or_late_cancel(
    sut: &mut Sut,
    works_before: &HashMap<u64, WorkId>,
    effect: &Effect,
) {
    let Effect::CancelWork { work, .. } = effect else {
        return;
    };
    assert!(
        !sut.ended.contains(work),
        "G6: CancelWork for {work:?}, which already ended"
    );
    assert_eq!(
        works_before.get(&work.session.get()),
        Some(work),
        "G6: CancelWork for {work:?}, which is not the session's current work"
    );
    let at = sut.now_ms;
    assert!(
        sut.cancels.insert(*work, at).is_none(),
        "G6: {work:?} cancelled twice"
    );
}

/// G5: after a tick past `settle_timeout` since the cancel, the work is gone
/// (exited or detached).
fn g5_every_cancelled_work_settles_by_its_deadline(sut: &Sut) {
    for id in sut.parents.keys() {
        let Some(work) = sut.work_of(*id) else {
            continue;
        };
        if let Some(at) = sut.cancels.get(&work) {
            assert!(
                at + sut.settle_ms > sut.now_ms,
                "G5: {work:?} cancelled at {at} ms still holds its session at {} ms",
                sut.now_ms
            );
        }
    }
}

fn g9_nothing_new_starts_after_shutdown_began(was_shutting_down: bool, step: &Step, ok: bool) {
    if was_shutting_down && matches!(step, Step::Register { .. } | Step::StartTurn(_)) {
        assert!(!ok, "G9: {step:?} accepted after shutdown began");
    }
}

/// G9: never finalized while its work is still there to write; every
/// transcript open at shutdown is flushed before its session is finalized;
/// the end of shutdown is announced once, with everything finalized.
fn g9_no_finalize_while_the_work_can_write(sut: &mut Sut, effect: &Effect) {
    match effect {
        Effect::FlushTranscript { session } => {
            sut.flushed.insert(session.get());
        }
        Effect::Finalize(f) => {
            let id = f.session.get();
            assert_eq!(
                sut.work_of(id),
                None,
                "G9: session {id} finalized while its work can still write"
            );
            if sut.open_at_shutdown.contains(&id) {
                assert!(
                    sut.flushed.contains(&id),
                    "G9: session {id} finalized during shutdown before its transcript was flushed"
                );
            }
            assert_eq!(f.commit_memory, f.last_outcome == Some(Outcome::Completed));
        }
        Effect::ShutdownComplete => {
            sut.shutdown_completes += 1;
            assert_eq!(sut.shutdown_completes, 1, "G9: shutdown completed twice");
            assert!(sut.core.is_shutting_down());
            for id in sut.parents.keys() {
                assert_eq!(
                    sut.timeline.get(id),
                    Some(&State::Finalized),
                    "G9: shutdown complete with session {id} not finalized"
                );
            }
        }
        _ => {}
    }
}

fn g9_shutdown_completes_once_every_work_is_gone(sut: &Sut) {
    if !sut.core.is_shutting_down() {
        return;
    }
    let works_left = sut.parents.keys().any(|id| sut.work_of(*id).is_some());
    let holds_left = sut
        .parents
        .keys()
        .any(|id| sut.held(*id) && sut.state_of(*id) != Some(State::Finalized));
    // Held idle sessions may wait for the end of the drain; nothing else waits.
    if works_left || (holds_left && !sut.core.is_drained()) {
        return;
    }
    for id in sut.parents.keys() {
        assert_eq!(
            sut.state_of(*id),
            Some(State::Finalized),
            "G9: every work is gone but session {id} is not finalized"
        );
    }
    assert_eq!(sut.core.open_sessions(), 0);
    assert_eq!(
        sut.shutdown_completes, 1,
        "G9: ShutdownComplete not emitted once"
    );
}

// ===========================================================================

fn cases() -> u32 {
    std::env::var("SETTLE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

prop_state_machine! {
    #![proptest_config(Config {
        cases: cases(),
        // The model is replayed at every shrink step; keep failures readable.
        max_shrink_iters: 4096,
        failure_persistence: None,
        .. Config::default()
    })]

    #[test]
    fn the_core_keeps_every_guarantee_on_random_event_sequences(sequential 1..60 => CoreUnderTest);
}
