//! The system under test: the real [`Core`], driven as a driver drives it.
//!
//! Every input is fed with the shared fake clock's time and followed by the
//! drain rule. A `Tick { millis }` moves the clock on and wakes the core only
//! while `poll_timeout()` is due, with the current time, never the deadline
//! (firezone's `sut.rs`, quinn's `drive_timer`). What the core did is kept
//! in [`Observed`], learned only from its answers and its effects, so the
//! guarantees can be checked against what a driver would have seen.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use proptest_state_machine::StateMachineTest;
use settle_core::{
    CancelMode, Core, Effect, Finalize, Handled, Hold, Outcome, SessionId, State, WorkId,
};

use crate::assertions::{self, Ctx};
use crate::reference::{Answer, Model, Reference};
use crate::strategies::Step;

pub struct Sut {
    pub core: Core,
    /// The instant the fake clock started at.
    pub base: Instant,
    pub now_ms: u64,
    pub seen: Observed,
}

/// What the core was seen to do, from its answers and its effects only.
#[derive(Debug, Default)]
pub struct Observed {
    /// Sessions it accepted, with their parent.
    pub parents: BTreeMap<u64, Option<u64>>,
    /// Each session's state, as its `Transition` effects tell it.
    pub timeline: HashMap<u64, State>,
    /// The state each finalized session left for `finalized`.
    pub finalized_from: HashMap<u64, State>,
    /// Each session's one finalize plan.
    pub finalized: HashMap<u64, Finalize>,
    /// Works started (the `Started` answers), with the time.
    pub started: BTreeMap<WorkId, u64>,
    /// The one cancel each work was sent, with the time.
    pub cancels: HashMap<WorkId, (CancelMode, u64)>,
    /// Works whose stream the core ordered closed.
    pub close_orders: HashSet<WorkId>,
    /// Works whose stream attached (the core applied the report).
    pub attached: HashSet<WorkId>,
    /// Works whose stream attached after an immediate cancel (the attach
    /// race of seed 001): the core must order those closed.
    pub attached_after_cancel: HashSet<WorkId>,
    /// Works that reported their stream closed (applied).
    pub closed_by_work: HashSet<WorkId>,
    /// Works the core abandoned, and which of them after shutdown began.
    pub detached: HashSet<WorkId>,
    pub detached_in_shutdown: Vec<WorkId>,
    /// The outcome each work ended with (`EndWork`).
    pub ended: HashMap<WorkId, Outcome>,
    /// The outcome of each session's last turn.
    pub last_turn: HashMap<u64, Outcome>,
    /// The outcome of each session's last task.
    pub last_task: HashMap<u64, Outcome>,
    pub holds: HashMap<(u64, Hold), u32>,
    pub transports: HashMap<u64, u32>,
    /// `FlushTranscripts` was ordered: the shutdown began.
    pub flushed: bool,
    pub shutdown_completes: usize,
    /// Sessions the driver forgot.
    pub forgotten: HashSet<u64>,
    /// Sessions handed off to another process (SPEC §12), and how.
    pub handed_off: HashMap<u64, settle_core::HandOff>,
    /// A handoff began (`BeginHandoff` applied before any other shutdown).
    pub handoff: bool,
    /// The turns each adopted session came with.
    pub entry_turns: HashMap<u64, u32>,
}

impl Observed {
    pub fn is_finalized(&self, id: u64) -> bool {
        self.timeline.get(&id) == Some(&State::Finalized)
    }

    pub fn children(&self, id: u64) -> impl Iterator<Item = u64> + '_ {
        self.parents
            .iter()
            .filter(move |(_, p)| **p == Some(id))
            .map(|(c, _)| *c)
    }

    pub fn descendants(&self, id: u64) -> Vec<u64> {
        let mut out = Vec::new();
        let mut stack = vec![id];
        while let Some(p) = stack.pop() {
            for c in self.children(p) {
                out.push(c);
                stack.push(c);
            }
        }
        out
    }

    /// Works started and not yet ended, as far as the effects tell.
    pub fn live_works(&self) -> impl Iterator<Item = WorkId> + '_ {
        self.started
            .keys()
            .copied()
            .filter(|w| !self.ended.contains_key(w))
    }

    /// Learns from one effect, once the assertions have looked at it.
    pub fn record(&mut self, effect: &Effect, now_ms: u64) {
        match effect {
            Effect::CancelWork { work, mode } => {
                self.cancels.insert(*work, (*mode, now_ms));
            }
            Effect::CloseStream { work } => {
                self.close_orders.insert(*work);
            }
            Effect::DetachWork { work } => {
                self.detached.insert(*work);
                if self.flushed {
                    self.detached_in_shutdown.push(*work);
                }
            }
            Effect::EndWork { work, outcome } => {
                self.ended.insert(*work, *outcome);
                match work.turn_no() {
                    Some(_) => self.last_turn.insert(work.session.get(), *outcome),
                    None => self.last_task.insert(work.session.get(), *outcome),
                };
            }
            Effect::FlushTranscripts => self.flushed = true,
            Effect::Finalize(f) => {
                self.finalized.insert(f.session.get(), f.clone());
            }
            Effect::Transition(t) => {
                let id = t.session.get();
                if let (Some(from), State::Finalized) = (t.from, t.to) {
                    self.finalized_from.insert(id, from);
                }
                self.timeline.insert(id, t.to);
            }
            Effect::ShutdownComplete(_) => self.shutdown_completes += 1,
            Effect::HandOff(h) => {
                self.handed_off.insert(h.session.get(), *h);
            }
            // Checked step by step by `holds_are_recorded_as_they_change`.
            Effect::RecordHolds { .. } => {}
            // The harness records a set effect as the single orders it
            // stands for.
            Effect::CancelWorks { .. } | Effect::Transitions(_) => {
                unreachable!("a set effect is recorded as singles")
            }
        }
    }

    /// Learns from an input the core applied.
    pub fn applied(&mut self, step: &Step) {
        fn count<K: std::hash::Hash + Eq>(map: &mut HashMap<K, u32>, key: K, up: bool) {
            let n = map.entry(key).or_default();
            *n = if up { *n + 1 } else { n.saturating_sub(1) };
        }
        match *step {
            Step::Register {
                session, parent, ..
            } => {
                self.parents.insert(session, parent);
            }
            Step::BeginHandoff { .. } => self.handoff = true,
            // Withdrawn: as if it had never been registered; an id adopted
            // again starts with no hold and no transport.
            Step::Withdraw(id) => {
                self.parents.remove(&id);
                self.timeline.remove(&id);
                self.holds.retain(|(session, _), _| *session != id);
                self.transports.remove(&id);
            }
            Step::Hold(id, hold) => count(&mut self.holds, (id, hold), true),
            Step::Release(id, hold) => count(&mut self.holds, (id, hold), false),
            Step::TransportAttached(id, _) => count(&mut self.transports, id, true),
            Step::TransportDetached(id) => count(&mut self.transports, id, false),
            Step::StreamAttached(work) => {
                self.attached.insert(work);
                if matches!(self.cancels.get(&work), Some((CancelMode::Immediate, _))) {
                    self.attached_after_cancel.insert(work);
                }
            }
            Step::StreamClosed(work) => {
                self.closed_by_work.insert(work);
            }
            _ => {}
        }
    }
}

impl Sut {
    pub fn at(&self) -> Instant {
        self.base + Duration::from_millis(self.now_ms)
    }

    /// What a driver does when its timer may have fired: compare the next
    /// deadline with the clock, and wake the core with the current time only
    /// while it is due.
    fn tick(&mut self, millis: u64, effects: &mut Vec<Effect>) -> usize {
        self.now_ms += millis;
        let now = self.at();
        let mut wakes = 0;
        while let Some(deadline) = self.core.poll_timeout() {
            if deadline.at > now {
                break;
            }
            assertions::the_core_never_asks_for_a_time_in_the_past(wakes, deadline, now);
            self.core.handle_timeout(now);
            wakes += 1;
            while let Some(e) = self.core.poll_effect() {
                effects.extend(e.singles());
            }
        }
        wakes
    }
}

pub struct CoreUnderTest;

impl StateMachineTest for CoreUnderTest {
    type SystemUnderTest = Sut;
    type Reference = Reference;

    fn init_test(model: &Model) -> Sut {
        Sut {
            core: Core::new(model.policy.to_policy()),
            base: Instant::now(),
            now_ms: 0,
            seen: Observed::default(),
        }
    }

    fn apply(mut sut: Sut, model: &Model, step: Step) -> Sut {
        let shutting_down = sut.core.is_shutting_down();
        let drained = sut.core.is_drained();
        let finalized_before = step.session().is_some_and(|id| sut.seen.is_finalized(id));
        let mut effects = Vec::new();
        let mut wakes = 0;
        let answer = match step {
            Step::Tick { millis } => {
                wakes = sut.tick(millis, &mut effects);
                Answer::Ticked
            }
            Step::Forget(id) => Answer::Forgot(sut.core.forget(SessionId(id))),
            _ => {
                let event = step.event().expect("an event");
                let answer = sut.core.handle(sut.at(), event);
                // The drain rule: every effect before the next input.
                // A set effect is checked as the single orders it
                // stands for (a set is a faster way to give the same
                // orders, not a weaker one).
                while let Some(e) = sut.core.poll_effect() {
                    effects.extend(e.singles());
                }
                Answer::Handled(answer)
            }
        };
        let ctx = Ctx {
            step: &step,
            answer: &answer,
            effects: &effects,
            now_ms: sut.now_ms,
            base: sut.base,
            policy: &model.policy,
            shutting_down,
            drained,
            finalized_before,
            woken: wakes > 0,
        };
        assertions::after_each_step(&sut.seen, &sut, &ctx);
        assertions::the_model_and_the_core_agree(&sut, model, &ctx);
        match answer {
            Answer::Handled(Ok(Handled::Applied)) => sut.seen.applied(&step),
            Answer::Handled(Ok(Handled::Started(work))) => {
                sut.seen.started.insert(work, sut.now_ms);
            }
            _ => {}
        }
        let adopted = match answer {
            Answer::Handled(Ok(Handled::Applied)) => step.adopted(),
            _ => Vec::new(),
        };
        for (session, turns, last_outcome, (pending_input, delegation)) in adopted {
            // It comes with the holds it was released with (G3).
            for (hold, n) in [
                (Hold::PendingInput, pending_input),
                (Hold::Delegation, delegation),
            ] {
                sut.seen.holds.insert((session, hold), u32::from(n));
            }
            // Its record starts again here (a withdrawn id may come back).
            match last_outcome {
                Some(outcome) => sut.seen.last_turn.insert(session, outcome),
                None => sut.seen.last_turn.remove(&session),
            };
            sut.seen.last_task.remove(&session);
            // Its parent is the one the core gave it (its own, or none).
            let view = sut.core.session(SessionId(session)).expect("adopted");
            let parent = view.parent().map(|p| p.get());
            sut.seen.parents.insert(session, parent);
            sut.seen.entry_turns.insert(session, turns);
            sut.seen.handed_off.remove(&session);
        }
        if let (Answer::Forgot(true), Some(id)) = (&answer, step.session()) {
            sut.seen.forgotten.insert(id);
        }
        for effect in &effects {
            sut.seen.record(effect, sut.now_ms);
        }
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        assertions::always(sut, model);
    }
}
