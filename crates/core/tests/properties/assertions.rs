//! The guarantees of SPEC §3 and the contract of issue 11, one function each,
//! checked after every step.
//!
//! Each function gets what the driver had seen before the step
//! ([`Observed`]), the step with its answer and its effects in order
//! ([`Ctx`]), and the core afterwards. Most are judged from the effects
//! alone, as a driver would see them; the last one compares the core with
//! the reference model.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use settle_core::{
    CancelMode, Cause, Core, Deadline, Effect, EndReason, Error, Handled, Outcome, Scope,
    SessionId, State, WorkId, WorkKind,
};

use crate::reference::{Answer, Model, RefPolicy};
use crate::strategies::{AdoptedMember, Span, Step};
use crate::sut::{Observed, Sut};

/// One step as the driver saw it.
pub struct Ctx<'a> {
    pub step: &'a Step,
    pub answer: &'a Answer,
    /// Every effect of the step, in order.
    pub effects: &'a [Effect],
    pub now_ms: u64,
    pub base: Instant,
    pub policy: &'a RefPolicy,
    /// Whether a shutdown had begun before the step, and its drain ended.
    pub shutting_down: bool,
    pub drained: bool,
    /// Whether the step's session was finalized before the step.
    pub finalized_before: bool,
    /// Whether a tick woke the core.
    pub woken: bool,
}

impl Ctx<'_> {
    fn applied(&self) -> bool {
        *self.answer == Answer::Handled(Ok(Handled::Applied))
    }

    fn now(&self) -> Instant {
        self.base + Duration::from_millis(self.now_ms)
    }

    /// How the last work of `kind` of `session` ended among the effects
    /// before the `i`-th one, if one did.
    fn ended_before(&self, i: usize, session: SessionId, kind: WorkKind) -> Option<Outcome> {
        self.before(i).iter().rev().find_map(|e| match e {
            Effect::EndWork { work, outcome } if work.session == session && work.kind == kind => {
                Some(*outcome)
            }
            _ => None,
        })
    }

    /// What this step adopted of `session`, if it did: its record starts
    /// again here.
    fn adopted(&self, session: SessionId) -> Option<AdoptedMember> {
        match self.applied() {
            true => self
                .step
                .adopted()
                .into_iter()
                .find(|m| m.0 == session.get()),
            false => None,
        }
    }

    /// The outcome of `session`'s last turn as the effects before the `i`-th
    /// one tell: the last turn ended among them, else the one ended before
    /// the step, or the one it was adopted with when this step adopted it
    /// (its record starts again here, and may end in this same step: an
    /// eviction that makes room for it can wind its new parent down).
    fn last_turn_before(&self, seen: &Observed, i: usize, session: SessionId) -> Option<Outcome> {
        self.ended_before(i, session, WorkKind::Turn)
            .or_else(|| match self.adopted(session) {
                Some((_, _, last_outcome, _)) => last_outcome,
                None => seen.last_turn.get(&session.get()).copied(),
            })
    }

    /// The outcome of `session`'s last task as the effects before the
    /// `i`-th one tell, else as ended before the step (none for a session
    /// this step adopted).
    fn last_task_before(&self, seen: &Observed, i: usize, session: SessionId) -> Option<Outcome> {
        self.ended_before(i, session, WorkKind::Task)
            .or_else(|| match self.adopted(session) {
                Some(_) => None,
                None => seen.last_task.get(&session.get()).copied(),
            })
    }

    /// The effects before the `i`-th one.
    fn before(&self, i: usize) -> &[Effect] {
        &self.effects[..i]
    }

    fn finalizes(&self) -> impl Iterator<Item = (usize, &settle_core::Finalize)> {
        self.effects
            .iter()
            .enumerate()
            .filter_map(|(i, e)| match e {
                Effect::Finalize(f) => Some((i, f)),
                _ => None,
            })
    }
}

/// The work an effect is about, if it is about one.
fn work_of(effect: &Effect) -> Option<WorkId> {
    match effect {
        Effect::CancelWork { work, .. }
        | Effect::CloseStream { work }
        | Effect::DetachWork { work }
        | Effect::EndWork { work, .. } => Some(*work),
        _ => None,
    }
}

fn ended_by(seen: &Observed, earlier: &[Effect], work: WorkId) -> bool {
    seen.ended.contains_key(&work)
        || earlier
            .iter()
            .any(|e| matches!(e, Effect::EndWork { work: w, .. } if *w == work))
}

fn finalized_by(seen: &Observed, earlier: &[Effect], id: u64) -> bool {
    seen.is_finalized(id)
        || earlier
            .iter()
            .any(|e| matches!(e, Effect::Finalize(f) if f.session.get() == id))
}

fn handed_off_by(seen: &Observed, earlier: &[Effect], id: u64) -> bool {
    seen.handed_off.contains_key(&id)
        || earlier
            .iter()
            .any(|e| matches!(e, Effect::HandOff(h) if h.session.get() == id))
}

fn cancel_of(seen: &Observed, ctx: &Ctx, work: WorkId) -> Option<(CancelMode, u64)> {
    seen.cancels.get(&work).copied().or_else(|| {
        ctx.effects.iter().find_map(|e| match e {
            Effect::CancelWork { work: w, mode } if *w == work => Some((*mode, ctx.now_ms)),
            _ => None,
        })
    })
}

/// The counts of holds and transports once the step is applied.
fn held_after(seen: &Observed, ctx: &Ctx, id: u64) -> bool {
    let delta = match *ctx.step {
        Step::Hold(s, _) if s == id && ctx.applied() => 1,
        Step::Release(s, _) if s == id && ctx.applied() => -1,
        _ => 0,
    };
    let n: i64 = seen
        .holds
        .iter()
        .filter(|((s, _), _)| *s == id)
        .map(|(_, n)| i64::from(*n))
        .sum();
    n + delta > 0
}

fn transports_after(seen: &Observed, ctx: &Ctx, id: u64) -> i64 {
    let delta = match *ctx.step {
        Step::TransportAttached(s, _) if s == id && ctx.applied() => 1,
        Step::TransportDetached(s) if s == id && ctx.applied() => -1,
        _ => 0,
    };
    i64::from(seen.transports.get(&id).copied().unwrap_or(0)) + delta
}

/// Every live work the core knows, from its session views.
fn core_works(core: &Core) -> BTreeSet<WorkId> {
    core.sessions().flat_map(|s| s.works()).collect()
}

// ===========================================================================

/// Run on every step: each guarantee, then what the driver learns.
pub fn after_each_step(seen: &Observed, sut: &Sut, ctx: &Ctx) {
    states_move_by_the_transition_table(seen, ctx);
    g1_settle_before_close(seen, &sut.core, ctx);
    g2_finalize_exactly_once(seen, ctx);
    g3_sweepers_spare_live_turns(seen, &sut.core, ctx);
    g4_every_stream_is_closed(seen, &sut.core, ctx);
    g5_bounded_settle(seen, &sut.core, ctx);
    g6_no_duplicate_cancel(seen, ctx);
    g7_memory_only_from_completed_turns(seen, ctx);
    g9_graceful_shutdown(seen, &sut.core, ctx);
    g10_closed_handles_fail_loudly(ctx);
    budgets_end_only_spent_subtrees(&sut.core, ctx);
    g12_handoff_and_adoption(seen, &sut.core, ctx);
    holds_are_recorded_as_they_change(seen, ctx);
    effects_are_orders(seen, &sut.core, ctx);
}

/// SPEC §5 across a crash: a hold taken or given back is recorded at once
/// with the session's counts after it (a process adopting the session after
/// this one crashed keeps them); a session finalized while held has none
/// recorded just before its transition to `finalized` (it has no adopter,
/// so nothing is kept for it); and nothing else records holds.
fn holds_are_recorded_as_they_change(seen: &Observed, ctx: &Ctx) {
    let changed = match *ctx.step {
        Step::Hold(id, hold) | Step::Release(id, hold) if ctx.applied() => Some((id, hold)),
        _ => None,
    };
    // A session's count of `kind` once the step's own change is applied.
    // One adopted by this step comes with the holds it was released with
    // (and may be finalized in the same step, its holds dropped: adopted
    // under an ancestor that the adoption's own eviction winds down).
    let adopted = match ctx.applied() {
        true => ctx.step.adopted(),
        false => Vec::new(),
    };
    let count = |id: u64, kind: settle_core::Hold| {
        let before = match adopted.iter().find(|m| m.0 == id) {
            Some(&(_, _, _, (input, delegation))) => u32::from(match kind {
                settle_core::Hold::PendingInput => input,
                settle_core::Hold::Delegation => delegation,
            }),
            None => seen.holds.get(&(id, kind)).copied().unwrap_or(0),
        };
        let after = match (ctx.step, changed) {
            (Step::Hold(..), Some((c, k))) if c == id && k == kind => before + 1,
            (Step::Release(..), Some((c, k))) if c == id && k == kind => before.saturating_sub(1),
            _ => before,
        };
        u16::try_from(after).unwrap_or(u16::MAX)
    };
    let holds_of = |id: u64| settle_core::Holds {
        pending_input: count(id, settle_core::Hold::PendingInput),
        delegation: count(id, settle_core::Hold::Delegation),
    };
    let none = settle_core::Holds::default();
    let mut recorded: Vec<(SessionId, settle_core::Holds)> = Vec::new();
    let mut dropped_for = Vec::new();
    let mut effects = ctx.effects.iter().peekable();
    while let Some(e) = effects.next() {
        let Effect::RecordHolds { session, holds } = e else {
            if let Effect::Finalize(f) = e {
                assert!(
                    holds_of(f.session.get()) == none || dropped_for.contains(&f.session),
                    "session {} finalized while held by {:?} without its holds dropped first",
                    f.session,
                    ctx.step
                );
            }
            continue;
        };
        // The step's own change is recorded first; any other record is a
        // held session's finalize dropping what was kept for it.
        let own = changed.is_some_and(|(id, _)| id == session.get())
            && !recorded.iter().any(|(s, _)| s == session);
        if own {
            recorded.push((*session, *holds));
            continue;
        }
        assert!(
            matches!(
                effects.peek(),
                Some(Effect::Transition(t)) if t.session == *session && t.to == State::Finalized
            ),
            "holds recorded by {:?} for session {session}, neither changed nor finalized",
            ctx.step
        );
        assert_eq!(*holds, none, "a finalized session's holds recorded as kept");
        assert_ne!(
            holds_of(session.get()),
            none,
            "holds dropped for session {session}, which held none, by {:?}",
            ctx.step
        );
        dropped_for.push(*session);
    }
    let Some((id, _)) = changed else {
        assert!(
            recorded.is_empty(),
            "holds recorded by {:?}, which changes none: {recorded:?}",
            ctx.step
        );
        return;
    };
    assert_eq!(
        recorded,
        [(SessionId(id), holds_of(id))],
        "the holds recorded by {:?}",
        ctx.step
    );
}

/// A session is finalized `budget_exhausted` only when a budget over it
/// (its own or an ancestor's) ran out; and the widest budget that ran out
/// finalizes every session under it that way, children first (G1, checked
/// by `g1_settle_before_close`).
fn budgets_end_only_spent_subtrees(core: &Core, ctx: &Ctx) {
    for effect in ctx.effects {
        let Effect::Finalize(f) = effect else {
            continue;
        };
        if f.reason != settle_core::EndReason::BudgetExhausted {
            continue;
        }
        let mut at = Some(f.session);
        let mut spent = false;
        while let Some(view) = at.and_then(|id| core.session(id)) {
            spent |= view.budget().is_some_and(|b| b.3);
            at = view.parent();
        }
        assert!(
            spent,
            "{} was finalized budget_exhausted with no spent budget over it",
            f.session
        );
    }
}

/// G12 (SPEC §12), within one process: a session is handed off only in a
/// handoff, once, idle (registered, no work that can still write), after
/// its children are finalized or handed off, and never once finalized;
/// after it nothing more is ordered about it (no finalize, no transition:
/// no sweeper of this process claims it while another adopts it), and
/// every input about it is refused `HandedOff` (a late report is a no-op).
/// Finalized and handed off are exclusive: each session ends here once, or
/// leaves once. An adopted session enters registered, open and idle.
fn g12_handoff_and_adoption(seen: &Observed, core: &Core, ctx: &Ctx) {
    let handoff =
        seen.handoff || matches!(ctx.step, Step::BeginHandoff { .. }) && !ctx.shutting_down;
    let mut gone: HashSet<u64> = seen.handed_off.keys().copied().collect();
    let mut finalized: HashSet<u64> = seen.finalized.keys().copied().collect();
    let mut states: HashMap<u64, State> = seen.timeline.clone();
    for (i, e) in ctx.effects.iter().enumerate() {
        if let Some(id) = effect_session(e) {
            assert!(
                !gone.contains(&id),
                "G12: {e:?} ordered after session {id} was handed off"
            );
        }
        match e {
            Effect::Transition(t) => {
                states.insert(t.session.get(), t.to);
            }
            Effect::Finalize(f) => {
                finalized.insert(f.session.get());
            }
            Effect::HandOff(h) => {
                let id = h.session.get();
                assert!(handoff, "G12: session {id} handed off outside a handoff");
                assert!(
                    !finalized.contains(&id),
                    "G12: session {id} handed off after it was finalized"
                );
                assert_eq!(
                    states.get(&id),
                    Some(&State::Registered),
                    "G12: session {id} handed off while not idle"
                );
                let live: Vec<WorkId> = seen
                    .started
                    .keys()
                    .copied()
                    .filter(|w| w.session == h.session && !ended_by(seen, ctx.before(i), *w))
                    .collect();
                assert!(
                    live.is_empty(),
                    "G12: session {id} handed off while {live:?} can still write"
                );
                for c in seen.children(id) {
                    assert!(
                        finalized.contains(&c) || gone.contains(&c),
                        "G12: session {id} handed off before its child {c}"
                    );
                }
                let turns = seen
                    .started
                    .keys()
                    .filter(|w| w.session == h.session && w.kind == WorkKind::Turn)
                    .count();
                let entry = seen.entry_turns.get(&id).copied().unwrap_or(0);
                assert_eq!(
                    h.turns,
                    entry + u32::try_from(turns).expect("few turns"),
                    "G12: session {id} handed off with its turn count"
                );
                let last = ctx.last_turn_before(seen, i, h.session);
                assert_eq!(
                    h.last_outcome, last,
                    "G12: session {id} handed off with its last outcome"
                );
                gone.insert(id);
            }
            _ => {}
        }
    }
    for id in &gone {
        assert!(
            core.session(SessionId(*id)).is_none() && core.is_handed_off(SessionId(*id)),
            "G12: session {id} is handed off, and the core still keeps it"
        );
    }
    // Every input about a session handed off before the step is refused.
    let asked = ctx
        .step
        .session()
        .filter(|id| seen.handed_off.contains_key(id));
    if let (Some(id), Answer::Handled(answer)) = (asked, ctx.answer) {
        match ctx.step {
            Step::Adopt { .. } => {}
            step if step.reports() => assert_eq!(*answer, Ok(Handled::NoOp)),
            _ => assert_eq!(
                *answer,
                Err(Error::HandedOff(SessionId(id))),
                "G12: {:?} about a session handed off",
                ctx.step
            ),
        }
        assert!(
            ctx.effects.is_empty(),
            "G12: an input about {id} ordered something"
        );
    }
    let adopted = match ctx.applied() {
        true => ctx.step.adopted(),
        false => Vec::new(),
    };
    for &(session, turns, ..) in &adopted {
        // It enters registered, as adopted (the same input may still wind
        // it down, as a registration's: an eviction's delegations).
        let entered = ctx.effects.iter().find_map(|e| match e {
            Effect::Transition(t) if t.session.get() == session => Some(t),
            _ => None,
        });
        let entered = entered.expect("an adoption is recorded");
        assert_eq!(
            (entered.from, entered.to, entered.cause),
            (None, State::Registered, Cause::Adopted),
            "G12: adopted open and idle"
        );
        if let Some(view) = core.session(SessionId(session)) {
            assert!(view.turns() >= turns, "G12: its turns go on");
        }
    }
    // A tree adopted whole (G1): its child under its parent here.
    if let (
        Step::Adopt {
            session,
            child: Some(c),
            ..
        },
        true,
    ) = (ctx.step, ctx.applied())
    {
        let parent = core.session(SessionId(c.session)).and_then(|v| v.parent());
        assert_eq!(
            parent,
            Some(SessionId(*session)),
            "G1: session {} adopted apart from its parent {session}",
            c.session
        );
    }
    // Refused, a tree leaves nothing behind: no member entered.
    if let (Step::Adopt { .. }, Answer::Handled(Err(_))) = (ctx.step, ctx.answer) {
        assert!(
            ctx.effects.is_empty(),
            "G1: a refused adoption ordered {:?}",
            ctx.effects
        );
    }
}

/// The session an effect is about, if any.
fn effect_session(e: &Effect) -> Option<u64> {
    match e {
        Effect::CancelWork { work, .. }
        | Effect::CloseStream { work }
        | Effect::DetachWork { work }
        | Effect::EndWork { work, .. } => Some(work.session.get()),
        Effect::Finalize(f) => Some(f.session.get()),
        Effect::Transition(t) => Some(t.session.get()),
        Effect::HandOff(h) => Some(h.session.get()),
        Effect::RecordHolds { session, .. } => Some(session.get()),
        Effect::FlushTranscripts | Effect::ShutdownComplete(_) => None,
        // The harness checks a set effect as the single orders it stands for.
        Effect::CancelWorks { .. } | Effect::Transitions(_) => {
            unreachable!("a set effect reaches the assertions as singles")
        }
    }
}

/// firezone's and quinn's lesson: once woken with the current time, the core
/// never asks for a time at or before it, or a driver would spin.
pub fn the_core_never_asks_for_a_time_in_the_past(wakes: usize, deadline: Deadline, now: Instant) {
    assert_eq!(
        wakes, 0,
        "after handle_timeout(now) the core asks for {deadline:?}, not after now ({now:?})"
    );
}

/// Every `Transition` starts where the timeline left the session and is a
/// move of the one transition table, `State::can_move_to`: states never go
/// backwards (but for a turn's end), and `finalized` is terminal.
fn states_move_by_the_transition_table(seen: &Observed, ctx: &Ctx) {
    let mut states: HashMap<u64, State> = HashMap::new();
    for e in ctx.effects {
        let Effect::Transition(t) = e else { continue };
        let id = t.session.get();
        let known = states.get(&id).or(seen.timeline.get(&id)).copied();
        assert_eq!(
            t.from, known,
            "{t:?} does not start where the timeline left session {id}"
        );
        match t.from {
            Some(from) => assert!(
                from.can_move_to(t.to),
                "session {id}: {from} -> {} is not in the transition table ({})",
                t.to,
                t.cause
            ),
            None => assert!(
                t.to == State::Registered
                    && matches!(ctx.step, Step::Register { .. } | Step::Adopt { .. }),
                "only a registration or an adoption starts a timeline: {t:?}"
            ),
        }
        assert_eq!(t.at, ctx.now(), "a transition carries the input's time");
        states.insert(id, t.to);
    }
}

/// G1: a session is finalized only after all its children; nothing below a
/// finalized session is open; the sessions an exit path winds down are
/// cancelled before the session's own works, and the caller of a subtree
/// cancel is not cancelled by it.
fn g1_settle_before_close(seen: &Observed, core: &Core, ctx: &Ctx) {
    for (i, f) in ctx.finalizes() {
        let id = f.session.get();
        for c in seen.children(id) {
            // A child handed off left this process's tree whole and idle;
            // one this step withdrew was never there.
            let withdrawn = *ctx.step == Step::Withdraw(c) && ctx.applied();
            assert!(
                withdrawn
                    || finalized_by(seen, ctx.before(i), c)
                    || handed_off_by(seen, ctx.before(i), c),
                "G1: session {id} finalized before its child {c}"
            );
        }
    }
    for view in core.sessions().filter(|v| v.state() == State::Finalized) {
        let id = view.id().get();
        for d in seen.descendants(id) {
            if let Some(state) = core.session(SessionId(d)).map(|v| v.state()) {
                assert_eq!(
                    state,
                    State::Finalized,
                    "G1: session {id} finalized while its descendant {d} is {state}"
                );
            }
        }
    }
    let (id, winds_down) = match *ctx.step {
        Step::AgentFinished(id) => (id, !ctx.shutting_down || ctx.drained),
        Step::Cancel(id, _) | Step::UserClose(id) | Step::CancelDescendants(id) => (id, true),
        _ => return,
    };
    if !ctx.applied() || !winds_down {
        return;
    }
    let below: HashSet<u64> = seen.descendants(id).into_iter().collect();
    for d in &below {
        let state = core.session(SessionId(*d)).map(|v| v.state());
        assert!(
            !matches!(state, Some(State::Registered | State::Running)),
            "G1: {:?} of session {id} left its descendant {d} {state:?}",
            ctx.step
        );
    }
    let cancels: Vec<u64> = ctx
        .effects
        .iter()
        .filter_map(|e| match e {
            Effect::CancelWork { work, .. } => Some(work.session.get()),
            _ => None,
        })
        .collect();
    if let Some(own) = cancels.iter().position(|s| *s == id) {
        assert!(
            cancels[own..].iter().all(|s| !below.contains(s)),
            "G1: a descendant of {id} was cancelled after {id} itself: {cancels:?}"
        );
    }
    // A delegation cycle may bring the cancel back to the caller: one of
    // its descendants delegated to a session that delegated to the caller,
    // and each delegate is cancelled when its delegator ends (the finalize
    // plan's last step). Then the caller is cancelled for that, not by
    // CancelDescendants.
    let interrupted = ctx.effects.iter().any(|e| {
        matches!(e, Effect::Transition(t)
            if t.session.get() == id && t.cause == Cause::DelegationInterrupted)
    });
    if let (Step::CancelDescendants(_), false) = (ctx.step, interrupted) {
        assert!(
            !cancels.contains(&id),
            "G1: CancelDescendants cancelled the caller {id}"
        );
        // It may settle or be reclaimed once its last child is gone (it was
        // winding down already, or a transport close was pending), never
        // leave `registered` or `running` for `cancelling` or `settled`.
        let cancelled = ctx.effects.iter().any(|e| {
            matches!(e, Effect::Transition(t)
                if t.session.get() == id
                    && matches!(t.from, Some(State::Registered | State::Running))
                    && matches!(t.to, State::Cancelling | State::Settled))
        });
        assert!(
            !cancelled,
            "G1: CancelDescendants cancelled the caller {id}"
        );
    }
}

/// G2: each session's finalize plan runs once, right after its transition to
/// `finalized`; asking again to end it is a no-op that says so.
fn g2_finalize_exactly_once(seen: &Observed, ctx: &Ctx) {
    for (i, f) in ctx.finalizes() {
        let id = f.session.get();
        assert!(
            !finalized_by(seen, ctx.before(i), id),
            "G2: session {id} finalized twice"
        );
        let transition = i.checked_sub(1).map(|j| &ctx.effects[j]);
        assert!(
            matches!(
                transition,
                Some(Effect::Transition(t))
                    if t.session == f.session
                        && t.to == State::Finalized
                        && t.cause == Cause::Finalized(f.reason)
            ),
            "G2: the finalize of {id} does not follow its transition: {transition:?}"
        );
    }
    if ctx.finalized_before && ctx.step.ends() {
        assert_eq!(
            *ctx.answer,
            Answer::Handled(Ok(Handled::AlreadyFinalized)),
            "G2: {:?} for a finalized session",
            ctx.step
        );
        assert!(ctx.effects.is_empty(), "G2: {:?}", ctx.effects);
    }
}

/// G3: an automatic reclaim takes only a registered session with no work and
/// no hold (the shutdown, a held one only once the drain is over), an orphan
/// or a closed transport only with no transport attached, an idle one only
/// after the TTL, and none during shutdown but the shutdown's own.
fn g3_sweepers_spare_live_turns(seen: &Observed, core: &Core, ctx: &Ctx) {
    let shutdown_began =
        |i: usize| ctx.shutting_down || ctx.before(i).contains(&Effect::FlushTranscripts);
    if let (Step::Register { .. }, Answer::Handled(Err(Error::OverCapacity { .. }))) =
        (ctx.step, ctx.answer)
    {
        assert!(
            ctx.effects.is_empty(),
            "G3: a registration refused over the cap changed something: {:?}",
            ctx.effects
        );
    }
    if let Step::Register { session, .. } = *ctx.step {
        // Room is made once the registration is committed: one the store
        // refuses, and the driver withdraws, evicts no one.
        for (_, f) in ctx.finalizes() {
            assert_ne!(
                f.reason,
                EndReason::LruEvict,
                "G3: session {} evicted before the registration of {session} was committed",
                f.session
            );
        }
    }
    for (i, f) in ctx.finalizes() {
        let id = f.session.get();
        let from = match i.checked_sub(1).map(|j| &ctx.effects[j]) {
            Some(Effect::Transition(t)) => t.from,
            _ => None,
        };
        if matches!(
            f.reason,
            EndReason::IdleReap
                | EndReason::LruEvict
                | EndReason::OrphanReap
                | EndReason::TransportClosed
        ) {
            assert_eq!(
                from,
                Some(State::Registered),
                "G3: {} reclaim of session {id} from {from:?}",
                f.reason
            );
            assert!(!shutdown_began(i), "G3: {} during shutdown", f.reason);
        }
        if from != Some(State::Registered) {
            continue;
        }
        // A claim (recovery's, once the lease is lost, is the shutdown's).
        assert!(
            f.reason.is_reclaim() || f.reason == EndReason::Recovered,
            "G3: claimed with {}",
            f.reason
        );
        let held = held_after(seen, ctx, id);
        match f.reason {
            EndReason::Shutdown | EndReason::Recovered => assert!(
                !held || core.is_drained(),
                "G3: held session {id} reclaimed by the shutdown before the drain ended"
            ),
            reason => assert!(!held, "G3: held session {id} reclaimed ({reason})"),
        }
        if matches!(f.reason, EndReason::OrphanReap | EndReason::TransportClosed) {
            assert_eq!(
                transports_after(seen, ctx, id),
                0,
                "G3: {} of session {id} with a transport attached",
                f.reason
            );
        }
        if let Step::Register { session, .. } | Step::Committed(session) = *ctx.step {
            assert_ne!(
                id, session,
                "G3: session {id} evicted by its own registration"
            );
        }
        // Room is made only among the sessions of the new one's scope.
        if let (
            EndReason::LruEvict,
            Step::Register { session, .. } | Step::Adopt { session, .. } | Step::Committed(session),
        ) = (f.reason, ctx.step)
        {
            let evicted = core.session(f.session).expect("known").scope();
            let new = core.session(SessionId(*session)).expect("kept").scope();
            assert_eq!(
                evicted, new,
                "G3: session {id} of scope {evicted} evicted for session {session} of scope {new}"
            );
        }
        // The new session's scope is the one named, else its parent's.
        if let (
            Step::Register {
                session,
                parent,
                scope,
            },
            true,
        ) = (ctx.step, ctx.applied())
        {
            let parents = parent
                .and_then(|p| core.session(SessionId(p)))
                .map(|p| p.scope());
            let want = scope.map(Scope).or(parents).unwrap_or(Scope::SHARED);
            let got = core.session(SessionId(*session)).expect("kept").scope();
            assert_eq!(got, want, "session {session} registered in the wrong scope");
        }
        if let (EndReason::IdleReap, Some(Span::Ms(ttl))) = (f.reason, ctx.policy.idle_ttl) {
            let since = core.session(f.session).expect("known").idle_since();
            assert!(
                ctx.now() >= since + Duration::from_millis(ttl),
                "G3: session {id} reaped before it was idle for the TTL"
            );
        }
    }
}

/// G4 (the core's part): a stream is ordered closed at most once, only when
/// it is attached and not closed by its work, and always before its work is
/// detached; a stream that attached after its work's immediate cancel is
/// ordered closed at once (the attach race of seed 001).
fn g4_every_stream_is_closed(seen: &Observed, core: &Core, ctx: &Ctx) {
    let attached = |w: WorkId| {
        seen.attached.contains(&w) || (*ctx.step == Step::StreamAttached(w) && ctx.applied())
    };
    let closed_by_work = |w: WorkId| {
        seen.closed_by_work.contains(&w) || (*ctx.step == Step::StreamClosed(w) && ctx.applied())
    };
    let ordered = |w: WorkId, earlier: &[Effect]| {
        seen.close_orders.contains(&w) || earlier.contains(&Effect::CloseStream { work: w })
    };
    for (i, e) in ctx.effects.iter().enumerate() {
        match *e {
            Effect::CloseStream { work } => {
                assert!(
                    !ordered(work, ctx.before(i)),
                    "G4: stream of {work} closed twice"
                );
                assert!(attached(work), "G4: {work} has no stream to close");
                assert!(
                    !closed_by_work(work),
                    "G4: {work} closed its stream already"
                );
            }
            Effect::DetachWork { work } if attached(work) && !closed_by_work(work) => {
                assert!(
                    ordered(work, ctx.before(i)),
                    "G4: {work} detached with its stream open"
                );
            }
            _ => {}
        }
    }
    // The attach race: a stream that attached after an immediate cancel may
    // never see it, so the core orders it closed. (A stream attached before
    // the cancel is closed by its work, whose token the cancel ends.)
    let raced = |w: WorkId| {
        seen.attached_after_cancel.contains(&w)
            || (*ctx.step == Step::StreamAttached(w)
                && ctx.applied()
                && seen.cancels.get(&w).map(|c| c.0) == Some(CancelMode::Immediate))
    };
    for work in core_works(core) {
        if raced(work) && !closed_by_work(work) {
            assert!(
                ordered(work, ctx.effects),
                "G4: {work} attached after its immediate cancel and its stream is still open"
            );
        }
    }
}

/// G5: a cancelled work is detached at its settle deadline, not before, and
/// no cancelled work outlives it once the clock has passed it.
fn g5_bounded_settle(seen: &Observed, core: &Core, ctx: &Ctx) {
    let deadline = |work: WorkId| {
        let (_, at) = cancel_of(seen, ctx, work)?;
        ctx.policy.settle.after(at)
    };
    for e in ctx.effects {
        if let Effect::DetachWork { work } = *e {
            let due = deadline(work).expect("G5: only a cancelled work is detached");
            assert!(
                due <= ctx.now_ms,
                "G5: {work} detached at {} ms, before its deadline {due} ms",
                ctx.now_ms
            );
        }
    }
    if !matches!(ctx.step, Step::Tick { .. }) {
        return;
    }
    for work in core_works(core) {
        if let Some(due) = deadline(work) {
            assert!(
                due > ctx.now_ms,
                "G5: {work} still holds its session at {} ms, past its deadline {due} ms",
                ctx.now_ms
            );
        }
    }
}

/// G6: a work is cancelled at most once, and never once it has ended.
fn g6_no_duplicate_cancel(seen: &Observed, ctx: &Ctx) {
    for (i, e) in ctx.effects.iter().enumerate() {
        let Effect::CancelWork { work, .. } = *e else {
            continue;
        };
        let earlier = ctx.before(i);
        let again = seen.cancels.contains_key(&work)
            || earlier
                .iter()
                .any(|e| matches!(e, Effect::CancelWork { work: w, .. } if *w == work));
        assert!(!again, "G6: {work} cancelled twice");
        assert!(
            !ended_by(seen, earlier, work),
            "G6: {work} cancelled after it ended"
        );
    }
}

/// G7 and the end hook: memory is committed only when the session's last
/// turn completed; the plan says that turn's outcome, and the hook's
/// `completed` and `interrupted` flags follow it (seed 004).
fn g7_memory_only_from_completed_turns(seen: &Observed, ctx: &Ctx) {
    for (i, f) in ctx.finalizes() {
        let id = f.session.get();
        let last = ctx.last_turn_before(seen, i, f.session);
        assert_eq!(
            f.last_outcome, last,
            "G7: session {id}: the last turn's outcome"
        );
        // The record's outcome (SPEC §7): of the last turn, or of the
        // work when it ran no turn.
        let work = ctx.last_task_before(seen, i, f.session);
        assert_eq!(
            f.outcome,
            last.or(work),
            "session {id}: the outcome its record says"
        );
        let completed = last == Some(Outcome::Completed);
        assert_eq!(
            f.commit_memory, completed,
            "G7: memory of session {id}: {f:?}"
        );
        assert_eq!(
            f.completed(),
            completed,
            "the end hook's completed flag: {f:?}"
        );
        assert_eq!(
            f.interrupted(),
            matches!(
                last,
                Some(Outcome::Cancelled | Outcome::Detached | Outcome::Interrupted)
            ),
            "the end hook's interrupted flag: {f:?}"
        );
    }
}

/// G9: no new session or work once shutdown began; transcripts flushed once,
/// first; nothing finalized while a work of it is live; every session
/// finalized after shutdown began ends `shutdown`; an agent finishing during
/// the drain cancels no descendant; at the end of the drain every work is
/// cancelled; idle sessions do not outlive the shutdown's start; and the end
/// of shutdown is announced once, when everything is finalized, saying what
/// was detached.
fn g9_graceful_shutdown(seen: &Observed, core: &Core, ctx: &Ctx) {
    if ctx.shutting_down
        && matches!(
            ctx.step,
            Step::Register { .. } | Step::StartTurn(_) | Step::StartTask(_)
        )
    {
        assert!(
            matches!(ctx.answer, Answer::Handled(Err(_))),
            "G9: {:?} accepted after shutdown began",
            ctx.step
        );
    }
    let mut flushed = seen.flushed;
    let mut completes = seen.shutdown_completes;
    for (i, e) in ctx.effects.iter().enumerate() {
        match e {
            Effect::FlushTranscripts => {
                assert!(!flushed, "G9: transcripts flushed twice");
                assert!(
                    matches!(
                        ctx.step,
                        Step::BeginShutdown { .. } | Step::BeginHandoff { .. } | Step::LeaseLost
                    ) && !ctx.shutting_down,
                    "G9: a flush outside the start of shutdown"
                );
                flushed = true;
            }
            Effect::Finalize(f) => {
                let id = f.session.get();
                if flushed {
                    assert!(
                        matches!(f.reason, EndReason::Shutdown | EndReason::Recovered),
                        "G9: session {id} finalized after shutdown began ends {}",
                        f.reason
                    );
                }
                let live: Vec<WorkId> = seen
                    .started
                    .keys()
                    .copied()
                    .filter(|w| w.session == f.session && !ended_by(seen, ctx.before(i), *w))
                    .collect();
                assert!(
                    live.is_empty(),
                    "G9: session {id} finalized while {live:?} can still write"
                );
            }
            Effect::ShutdownComplete(summary) => {
                completes += 1;
                assert_eq!(completes, 1, "G9: shutdown completed twice");
                assert!(flushed, "G9: complete before it began");
                for view in core.sessions() {
                    assert_eq!(
                        view.state(),
                        State::Finalized,
                        "G9: shutdown complete with {} open",
                        view.id()
                    );
                }
                let mut released: Vec<u64> = seen.handed_off.keys().copied().collect();
                released.extend(ctx.effects.iter().filter_map(|e| match e {
                    Effect::HandOff(h) => Some(h.session.get()),
                    _ => None,
                }));
                let mut said: Vec<u64> = summary.released.iter().map(|s| s.get()).collect();
                released.sort_unstable();
                said.sort_unstable();
                assert_eq!(said, released, "G12: the summary's released sessions");
                let mut detached = seen.detached_in_shutdown.clone();
                detached.extend(ctx.effects.iter().filter_map(|e| match e {
                    Effect::DetachWork { work } => Some(*work),
                    _ => None,
                }));
                let mut said = summary.detached.clone();
                detached.sort_unstable();
                said.sort_unstable();
                assert_eq!(said, detached, "G9: the summary's detached works");
            }
            _ => {}
        }
    }
    if let Step::AgentFinished(id) = *ctx.step {
        if ctx.shutting_down && !ctx.drained {
            for e in ctx.effects {
                if let Effect::CancelWork { work, .. } = e {
                    assert_eq!(
                        work.session.get(),
                        id,
                        "G9: an agent finishing during the drain cancelled {work}"
                    );
                }
                if let Effect::Transition(t) = e {
                    assert_ne!(
                        t.cause,
                        Cause::AncestorWindingDown,
                        "G9: an agent finishing during the drain wound down {}",
                        t.session
                    );
                }
            }
        }
    }
    if !core.is_shutting_down() {
        return;
    }
    let drained = core.is_drained();
    for view in core.sessions() {
        let id = view.id().get();
        if drained {
            for work in view.works() {
                assert!(
                    cancel_of(seen, ctx, work).is_some(),
                    "G9: the drain is over and {work} was never cancelled"
                );
            }
        }
        if view.state() == State::Registered {
            let waits_for_child = view.children().any(|c| {
                core.session(c)
                    .is_some_and(|c| c.state() != State::Finalized)
            });
            assert!(
                waits_for_child || (view.is_held() && !drained),
                "G9: session {id} is still idle and open during shutdown"
            );
        }
    }
    if core.open_sessions() == 0 {
        assert_eq!(
            completes, 1,
            "G9: everything is finalized, no ShutdownComplete"
        );
    }
}

/// G10 and the table on `Event`: using a finalized session fails loudly, a
/// late report about it is a no-op; neither changes anything.
fn g10_closed_handles_fail_loudly(ctx: &Ctx) {
    if !ctx.finalized_before {
        return;
    }
    let id = ctx.step.session().expect("a session");
    if ctx.step.uses() {
        assert_eq!(
            *ctx.answer,
            Answer::Handled(Err(Error::SessionClosed(SessionId(id)))),
            "G10: {:?}",
            ctx.step
        );
    }
    if ctx.step.reports() {
        assert_eq!(
            *ctx.answer,
            Answer::Handled(Ok(Handled::NoOp)),
            "a report about finalized session {id}"
        );
    }
    if ctx.step.uses() || ctx.step.reports() {
        assert!(ctx.effects.is_empty(), "{:?}: {:?}", ctx.step, ctx.effects);
    }
}

/// Effects are orders: a start that is admitted answers `Started` with the
/// next number; `EndWork` exactly once per work, with the outcome reported
/// (or `detached` right after a `DetachWork`), before the transition it
/// causes; nothing about a work before its start or after its end; and the
/// works the core holds are exactly those started and not ended.
fn effects_are_orders(seen: &Observed, core: &Core, ctx: &Ctx) {
    let started = match *ctx.answer {
        Answer::Handled(Ok(Handled::Started(work))) => Some(work),
        _ => None,
    };
    let asked = match *ctx.step {
        Step::StartTurn(id) => Some((id, WorkKind::Turn)),
        Step::StartTask(id) => Some((id, WorkKind::Task)),
        _ => None,
    };
    match (asked, started) {
        (Some((id, kind)), Some(work)) => {
            let before = seen
                .started
                .keys()
                .filter(|w| w.session.get() == id && w.kind == kind)
                .count();
            // An adopted session's turns go on from the ones it came with.
            let entry = match kind {
                WorkKind::Turn => seen.entry_turns.get(&id).copied().unwrap_or(0),
                WorkKind::Task => 0,
            };
            let expected = WorkId {
                session: SessionId(id),
                kind,
                no: entry + u32::try_from(before).expect("few works") + 1,
            };
            assert_eq!(work, expected, "the next work's id");
            assert!(!seen.started.contains_key(&expected));
        }
        (_, None) => {}
        (None, Some(work)) => panic!("{work} started by {:?}", ctx.step),
    }

    let mut report_ends = 0;
    for (i, e) in ctx.effects.iter().enumerate() {
        let earlier = ctx.before(i);
        if let Some(work) = work_of(e) {
            assert!(
                seen.started.contains_key(&work) || started == Some(work),
                "{e:?} about a work that never started"
            );
            assert!(!ended_by(seen, earlier, work), "{e:?} after {work} ended");
        }
        match *e {
            Effect::DetachWork { work } => {
                let next = ctx.effects.get(i + 1);
                assert_eq!(
                    next,
                    Some(&Effect::EndWork {
                        work,
                        outcome: Outcome::Detached
                    }),
                    "a detach is followed by the work's end"
                );
            }
            Effect::EndWork { work, outcome } => {
                let detached = earlier.last() == Some(&Effect::DetachWork { work });
                match *ctx.step {
                    Step::WorkEnded(w, reported) if w == work => {
                        assert_eq!(outcome, reported, "the reported outcome");
                        report_ends += 1;
                    }
                    Step::WorkExited(w) if w == work => {
                        let expected = match seen.cancels.contains_key(&work) {
                            true => Outcome::Cancelled,
                            false => Outcome::Failed,
                        };
                        assert_eq!(outcome, expected, "a report without an outcome");
                        report_ends += 1;
                    }
                    _ => assert!(detached, "{work} ended without a report or a detach"),
                }
                if detached {
                    assert_eq!(outcome, Outcome::Detached, "a detached work's outcome");
                }
            }
            Effect::Transition(ref t) => {
                let ended_here = |kind: WorkKind, outcome: Outcome| {
                    earlier.iter().any(|e| {
                        matches!(e, Effect::EndWork { work, outcome: o }
                            if work.session == t.session && work.kind == kind && *o == outcome)
                    })
                };
                match t.cause {
                    Cause::TurnEnded(o) => {
                        assert!(ended_here(WorkKind::Turn, o), "{t:?} before its EndWork")
                    }
                    Cause::TaskEnded(o) => {
                        assert!(ended_here(WorkKind::Task, o), "{t:?} before its EndWork")
                    }
                    Cause::SettleDeadline => assert!(
                        ended_here(WorkKind::Turn, Outcome::Detached)
                            || ended_here(WorkKind::Task, Outcome::Detached),
                        "{t:?} before its EndWork"
                    ),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    let reported = matches!(ctx.step, Step::WorkEnded(..) | Step::WorkExited(_));
    assert_eq!(
        report_ends,
        usize::from(reported && ctx.applied()),
        "an applied report ends its work once, anything else none"
    );

    let mut live: BTreeSet<WorkId> = seen.live_works().chain(started).collect();
    for e in ctx.effects {
        if let Effect::EndWork { work, .. } = *e {
            live.remove(&work);
        }
    }
    assert_eq!(
        core_works(core),
        live,
        "the core's works are those started and not ended"
    );
}

// ===========================================================================

/// The core and the reference model agree on the answer, the orders (as a
/// multiset: the model does not predict their order, the guarantees above
/// check it), and the next deadline.
pub fn the_model_and_the_core_agree(sut: &Sut, model: &Model, ctx: &Ctx) {
    assert_eq!(
        *ctx.answer, model.answer,
        "the answer to {:?} (left: the core, right: the model)",
        ctx.step
    );
    let normalize = |effects: &[Effect]| -> Vec<String> {
        let mut out: Vec<String> = effects
            .iter()
            .filter(|e| !matches!(e, Effect::Transition(_)))
            .map(|e| match e {
                Effect::ShutdownComplete(s) => {
                    let mut s = s.clone();
                    s.drained.sort_unstable();
                    s.cancelled.sort_unstable();
                    s.detached.sort_unstable();
                    s.released.sort_unstable();
                    format!("{:?}", Effect::ShutdownComplete(s))
                }
                e => format!("{e:?}"),
            })
            .collect();
        out.sort_unstable();
        out
    };
    assert_eq!(
        normalize(ctx.effects),
        normalize(&model.orders),
        "the orders for {:?} (left: the core, right: the model)",
        ctx.step
    );
    let core = sut.core.poll_timeout();
    let expected = model
        .next_deadline()
        .map(|(ms, kinds)| (sut.base + Duration::from_millis(ms), kinds));
    match (core, expected) {
        // Freshly woken, the core has dropped what nobody waits for: it
        // names the next live deadline, and why.
        (core, expected) if ctx.woken => {
            let core = core.map(|d| (d.at, d.kind));
            let fits = match (&core, &expected) {
                (Some((at, kind)), Some((first, kinds))) => at == first && kinds.contains(kind),
                (None, None) => true,
                _ => false,
            };
            assert!(
                fits,
                "the next deadline after a wake: {core:?}, expected {expected:?}"
            );
        }
        // Otherwise it may name a deadline that was cancelled since, never
        // one later than a live one (that would be a missed deadline).
        (core, Some((first, _))) => {
            let core = core.expect("a deadline is armed");
            assert!(core.at <= first, "{core:?} is after {first:?}");
        }
        (_, None) => {}
    }
}

/// Checked after every step: every view of every session says what the
/// model says, and nothing finalized sits above an open session (G1).
pub fn always(sut: &Sut, model: &Model) {
    let core = &sut.core;
    assert_eq!(core.policy(), &model.policy.to_policy());
    assert_eq!(core.open_sessions(), model.open_count(), "open sessions");
    assert_eq!(core.sessions().count(), model.sessions.len(), "sessions");
    assert_eq!(core.is_shutting_down(), model.shutdown.is_some());
    assert_eq!(core.is_drained(), model.drained());
    for id in &model.forgotten {
        assert!(core.session(SessionId(*id)).is_none(), "{id} was forgotten");
    }
    for (id, expected) in &model.sessions {
        let view = core
            .session(SessionId(*id))
            .unwrap_or_else(|| panic!("session {id} is known to the model, not to the core"));
        let what = |field: &str| format!("session {id}: {field}\nmodel: {expected:?}");
        assert_eq!(view.id(), SessionId(*id));
        assert_eq!(view.state(), expected.state, "{}", what("state"));
        assert_eq!(
            view.parent(),
            expected.parent.map(SessionId),
            "{}",
            what("parent")
        );
        let mut children: Vec<u64> = view.children().map(|c| c.get()).collect();
        children.sort_unstable();
        let expected_children: Vec<u64> = model
            .sessions
            .iter()
            .filter(|(_, c)| c.parent == Some(*id))
            .map(|(c, _)| *c)
            .collect();
        assert_eq!(children, expected_children, "{}", what("children"));
        assert_eq!(view.turns(), expected.turns, "{}", what("turns"));
        let turn = expected.works.iter().find(|w| w.id.kind == WorkKind::Turn);
        assert_eq!(view.work(), turn.map(|w| w.id), "{}", what("turn"));
        assert_eq!(
            view.work_cancel(),
            turn.and_then(|w| w.cancel),
            "{}",
            what("the cancel sent to its turn")
        );
        let works: BTreeSet<WorkId> = view.works().collect();
        let expected_works: BTreeSet<WorkId> = expected.works.iter().map(|w| w.id).collect();
        assert_eq!(works, expected_works, "{}", what("works"));
        assert_eq!(
            view.last_outcome(),
            expected.last_outcome,
            "{}",
            what("outcome")
        );
        assert_eq!(
            view.closing(),
            expected.intent.map(|i| i.reason(expected.last_outcome)),
            "{}",
            what("closing")
        );
        assert_eq!(view.is_held(), expected.held(), "{}", what("held"));
        assert_eq!(
            u32::from(view.transports()),
            expected.transports,
            "{}",
            what("transports")
        );
        assert_eq!(
            view.idle_since(),
            sut.base + Duration::from_millis(expected.idle_since),
            "{}",
            what("idle since")
        );
        // Budgets: the same limits, the same spent, the same inheritance.
        let budget = view.budget().map(|(limits, turns, tokens, exhausted)| {
            (
                limits.max_turns,
                limits.max_tokens,
                turns,
                tokens,
                exhausted,
            )
        });
        let expected_budget = expected
            .budget
            .as_ref()
            .map(|b| (b.max_turns, b.max_tokens, b.turns, b.tokens, b.exhausted));
        assert_eq!(budget, expected_budget, "{}", what("budget"));
        assert_eq!(
            view.is_budgeted(),
            expected.budgeted,
            "{}",
            what("budgeted")
        );
        let settle = expected.works.iter().filter_map(|w| w.settle_at).min();
        assert_eq!(
            view.settle_deadline(),
            settle.map(|ms| sut.base + Duration::from_millis(ms)),
            "{}",
            what("settle deadline")
        );
    }
}
