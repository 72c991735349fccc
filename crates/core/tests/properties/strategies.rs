//! The generators: one [`Step`] per input a driver can feed, time included
//! (`Tick { millis }`), picked from what the reference model knows so that
//! most steps are meaningful and some are deliberately not (finalized and
//! forgotten sessions, unknown parents, late reports from old works).

use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;
use proptest::strategy::Union;
use settle_core::{
    Adoptee, Budget, CancelMode, Event, Hold, Outcome, Scope, SessionId, State, Sweep, WorkId,
};

use crate::reference::{Model, RefPolicy};

/// A duration on the fake clock: whole milliseconds, or one too long to
/// represent (`Duration::MAX`), which the core must read as "never".
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Span {
    Ms(u64),
    Forever,
}

impl Span {
    pub fn duration(self) -> Duration {
        match self {
            Span::Ms(ms) => Duration::from_millis(ms),
            Span::Forever => Duration::MAX,
        }
    }

    /// `now + self`, or `None` when that is never.
    pub fn after(self, now: u64) -> Option<u64> {
        match self {
            Span::Ms(ms) => Some(now + ms),
            Span::Forever => None,
        }
    }

    pub fn is_zero(self) -> bool {
        self == Span::Ms(0)
    }
}

/// A child adopted in one tree with its parent ([`Step::Adopt`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdoptedChild {
    pub session: u64,
    pub turns: u32,
    pub last_outcome: Option<Outcome>,
    /// The holds it was released with: input, delegation.
    pub holds: (u16, u16),
    pub scope: u64,
    /// Named before its parent in the event (the core orders them).
    pub first: bool,
}

/// A session an applied [`Step::Adopt`] took on: its id, turns, last
/// outcome and holds (input, delegation).
pub type AdoptedMember = (u64, u32, Option<Outcome>, (u16, u16));

impl Step {
    /// The sessions an [`Step::Adopt`] names, parent first.
    pub fn adopted(&self) -> Vec<AdoptedMember> {
        match *self {
            Step::Adopt {
                session,
                turns,
                last_outcome,
                holds,
                child,
                ..
            } => std::iter::once((session, turns, last_outcome, holds))
                .chain(child.map(|c| (c.session, c.turns, c.last_outcome, c.holds)))
                .collect(),
            _ => Vec::new(),
        }
    }
}

/// One generated input: an [`Event`], a wake of the clock, or a `forget`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Register {
        session: u64,
        parent: Option<u64>,
        /// Whose it is, for the LRU cap: one of a few scopes, or none
        /// named (its parent's).
        scope: Option<u64>,
    },
    StartTurn(u64),
    StartTask(u64),
    StreamAttached(WorkId),
    StreamClosed(WorkId),
    /// A turn's start refused to its caller (the store did not take it).
    StartRefused(WorkId),
    WorkEnded(WorkId, Outcome),
    WorkExited(WorkId),
    AgentFinished(u64),
    /// A dropped guard.
    Abandoned(u64),
    Cancel(u64, CancelMode),
    CancelTurn(u64),
    CancelWork(WorkId),
    CancelDescendants(u64),
    UserClose(u64),
    /// `from` delegated to `to`.
    Delegate(u64, u64),
    Hold(u64, Hold),
    Release(u64, Hold),
    TransportAttached(u64, bool),
    TransportDetached(u64),
    Sweep(Sweep),
    BeginShutdown {
        drain: Span,
    },
    SkipDrain,
    /// This process lost its lease (G8).
    LeaseLost,
    /// A shutdown that hands sessions off (SPEC §12).
    BeginHandoff {
        drain: Span,
    },
    /// A session another process released is adopted here (SPEC §12).
    Adopt {
        session: u64,
        parent: Option<u64>,
        turns: u32,
        last_outcome: Option<Outcome>,
        /// The holds it was released with: input, delegation.
        holds: (u16, u16),
        /// Whose it is, for the LRU cap.
        scope: u64,
        /// A child released with it: the two are one tree, adopted whole or
        /// not at all (`Event::AdoptTree`).
        child: Option<AdoptedChild>,
    },
    /// The fake clock moves on; the driver wakes the core if it is due.
    Tick {
        millis: u64,
    },
    /// The driver drops the record of a finalized session (`Core::forget`).
    Forget(u64),
    /// A registration whose durable row could not be written is withdrawn.
    Withdraw(u64),
    /// A registration's durable row was committed.
    Committed(u64),
    /// A budget for the session's subtree: at most these turns, tokens,
    /// milliseconds of wall time.
    SetBudget(u64, Option<u32>, Option<u64>, Option<u64>),
    /// A work's usage report of this many tokens.
    Usage(WorkId, u64),
}

impl Step {
    /// The session the step is about, if any (a report's work's session).
    pub fn session(&self) -> Option<u64> {
        match *self {
            Step::StartTurn(id)
            | Step::StartTask(id)
            | Step::AgentFinished(id)
            | Step::Abandoned(id)
            | Step::Delegate(id, _)
            | Step::Cancel(id, _)
            | Step::CancelTurn(id)
            | Step::CancelDescendants(id)
            | Step::UserClose(id)
            | Step::Hold(id, _)
            | Step::Release(id, _)
            | Step::TransportAttached(id, _)
            | Step::TransportDetached(id)
            | Step::Forget(id)
            | Step::Withdraw(id)
            | Step::Committed(id)
            | Step::SetBudget(id, ..) => Some(id),
            Step::Adopt { session, .. } => Some(session),
            Step::StreamAttached(w)
            | Step::Usage(w, _)
            | Step::CancelWork(w)
            | Step::StreamClosed(w)
            | Step::StartRefused(w)
            | Step::WorkEnded(w, _)
            | Step::WorkExited(w) => Some(w.session.get()),
            Step::Register { .. }
            | Step::Sweep(_)
            | Step::BeginShutdown { .. }
            | Step::SkipDrain
            | Step::LeaseLost
            | Step::BeginHandoff { .. }
            | Step::Tick { .. } => None,
        }
    }

    /// The input as the core takes it; `None` for a tick or a forget.
    pub fn event(&self) -> Option<Event> {
        let sid = SessionId;
        Some(match *self {
            Step::Register {
                session,
                parent,
                scope,
            } => Event::Register {
                session: sid(session),
                parent: parent.map(sid),
                scope: scope.map(Scope),
            },
            Step::StartTurn(id) => Event::StartTurn { session: sid(id) },
            Step::StartTask(id) => Event::StartTask { session: sid(id) },
            Step::StreamAttached(work) => Event::StreamAttached { work },
            Step::StreamClosed(work) => Event::StreamClosed { work },
            Step::StartRefused(work) => Event::StartRefused { work },
            Step::WorkEnded(work, outcome) => Event::WorkEnded { work, outcome },
            Step::WorkExited(work) => Event::WorkExited { work },
            Step::AgentFinished(id) => Event::AgentFinished { session: sid(id) },
            Step::Abandoned(id) => Event::Abandoned { session: sid(id) },
            Step::Delegate(from, to) => Event::Delegate {
                from: sid(from),
                to: sid(to),
            },
            Step::Cancel(id, mode) => Event::Cancel {
                session: sid(id),
                mode,
            },
            Step::CancelTurn(id) => Event::CancelTurn { session: sid(id) },
            Step::CancelWork(work) => Event::CancelWork { work },
            Step::Withdraw(id) => Event::Withdraw { session: sid(id) },
            Step::Committed(id) => Event::Committed { session: sid(id) },
            Step::SetBudget(id, turns, tokens, wall) => {
                let mut budget = Budget::default();
                budget.max_turns = turns;
                budget.max_tokens = tokens;
                budget.max_wall = wall.map(Duration::from_millis);
                Event::SetBudget {
                    session: sid(id),
                    budget,
                }
            }
            Step::Usage(work, tokens) => Event::Usage { work, tokens },
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
            Step::BeginShutdown { drain } => Event::BeginShutdown {
                drain: drain.duration(),
            },
            Step::SkipDrain => Event::SkipDrain,
            Step::LeaseLost => Event::LeaseLost,
            Step::BeginHandoff { drain } => Event::BeginHandoff {
                drain: drain.duration(),
            },
            Step::Adopt {
                session,
                parent,
                turns,
                last_outcome,
                holds: (pending_input, delegation),
                scope,
                child: None,
            } => Event::Adopt(Adoptee {
                session: sid(session),
                parent: parent.map(sid),
                turns,
                last_outcome,
                holds: settle_core::Holds {
                    pending_input,
                    delegation,
                },
                scope: Scope(scope),
            }),
            Step::Adopt {
                session,
                parent,
                turns,
                last_outcome,
                holds,
                scope,
                child: Some(child),
            } => {
                let adoptee = |session: u64,
                               parent: Option<u64>,
                               turns,
                               last_outcome,
                               holds: (u16, u16),
                               scope| {
                    settle_core::Adoptee {
                        session: sid(session),
                        parent: parent.map(sid),
                        turns,
                        last_outcome,
                        holds: settle_core::Holds {
                            pending_input: holds.0,
                            delegation: holds.1,
                        },
                        scope: Scope(scope),
                    }
                };
                let top = adoptee(session, parent, turns, last_outcome, holds, scope);
                let under = adoptee(
                    child.session,
                    Some(session),
                    child.turns,
                    child.last_outcome,
                    child.holds,
                    child.scope,
                );
                Event::AdoptTree {
                    members: match child.first {
                        true => vec![under, top],
                        false => vec![top, under],
                    },
                }
            }
            Step::Tick { .. } | Step::Forget(_) => return None,
        })
    }

    /// An input that asks to end or let go of a session (the table on `Event`).
    pub fn ends(&self) -> bool {
        matches!(
            self,
            Step::AgentFinished(_)
                | Step::Abandoned(_)
                | Step::Cancel(..)
                | Step::CancelTurn(_)
                | Step::CancelWork(_)
                | Step::Withdraw(_)
                | Step::CancelDescendants(_)
                | Step::UserClose(_)
                | Step::Release(..)
                | Step::TransportDetached(_)
        )
    }

    /// An input that uses a session (the table on `Event`).
    pub fn uses(&self) -> bool {
        matches!(
            self,
            Step::StartTurn(_)
                | Step::StartTask(_)
                | Step::Hold(..)
                | Step::TransportAttached(..)
                | Step::Delegate(..)
                | Step::SetBudget(..)
        )
    }

    /// A work's report (the table on `Event`).
    pub fn reports(&self) -> bool {
        matches!(
            self,
            Step::StreamAttached(_)
                | Step::StreamClosed(_)
                | Step::StartRefused(_)
                | Step::WorkEnded(..)
                | Step::WorkExited(_)
                | Step::Committed(_)
        )
    }
}

/// The policy of one run: zero and "forever" included, so deadline
/// arithmetic that overflows (issue 11, item 11) and deadlines due at once
/// are exercised like any other.
pub fn policy() -> impl Strategy<Value = RefPolicy> {
    let span = |ms: Vec<u64>| {
        let mut choices: Vec<Span> = ms.into_iter().map(Span::Ms).collect();
        choices.push(Span::Forever);
        select(choices)
    };
    (
        span(vec![0, 1, 50, 200, 200]),
        prop_oneof![
            2 => Just(None),
            1 => Just(Some(Span::Ms(0))),
            3 => select(vec![Span::Ms(300), Span::Ms(1500), Span::Forever]).prop_map(Some),
        ],
        select(vec![
            None,
            None,
            None,
            Some(1usize),
            Some(2),
            Some(3),
            Some(6),
        ]),
        span(vec![0, 30, 100, 700]),
        select(vec![None, None, None, Some(1usize), Some(2), Some(4)]),
    )
        .prop_map(
            |(settle, idle_ttl, lru_cap, orphan_grace, slots)| RefPolicy {
                settle,
                idle_ttl,
                lru_cap,
                orphan_grace,
                slots,
            },
        )
}

fn outcome() -> impl Strategy<Value = Outcome> {
    prop_oneof![
        3 => Just(Outcome::Completed),
        1 => Just(Outcome::Failed),
        1 => Just(Outcome::IdleTimeout),
        1 => Just(Outcome::Cancelled),
    ]
}

fn hold() -> impl Strategy<Value = Hold> {
    prop_oneof![Just(Hold::PendingInput), Just(Hold::Delegation)]
}

/// The next input, given what the model knows.
pub fn step(model: &Model) -> BoxedStrategy<Step> {
    let ids = |keep: &dyn Fn(&crate::reference::RefSession) -> bool| -> Vec<u64> {
        model
            .sessions
            .iter()
            .filter(|(_, s)| keep(s))
            .map(|(id, _)| *id)
            .collect()
    };
    let open = ids(&|s| s.state != State::Finalized);
    let startable = ids(&|s| s.state.is_open() && s.intent.is_none());
    let with_turn = ids(&|s| s.works.iter().any(|w| w.id.turn_no().is_some()));
    let turnless: Vec<u64> = startable
        .iter()
        .copied()
        .filter(|id| !with_turn.contains(id))
        .collect();
    let attached = ids(&|s| s.state != State::Finalized && s.transports > 0);
    let held = ids(&|s| s.state != State::Finalized && s.held());
    let finalized = ids(&|s| s.state == State::Finalized);
    let mut known = ids(&|_| true);
    known.extend(model.forgotten.iter().copied());
    let live_works: Vec<WorkId> = model
        .sessions
        .values()
        .flat_map(|s| s.works.iter().map(|w| w.id))
        .collect();
    let old_works = model.old_works();
    let shutting_down = model.shutdown.is_some();

    let mut choices: Vec<(u32, BoxedStrategy<Step>)> = Vec::new();
    let tick = prop_oneof![
        3 => 0u64..=60,
        3 => 60u64..=400,
        1 => 400u64..=2500,
    ]
    .prop_map(|millis| Step::Tick { millis });
    choices.push((8, tick.boxed()));
    let sweep = prop_oneof![Just(Sweep::Idle), Just(Sweep::Lru), Just(Sweep::Orphan)];
    choices.push((1, sweep.prop_map(Step::Sweep).boxed()));
    // Rare, so that most sequences live a while before they shut down.
    let drain = prop_oneof![
        1 => Just(Span::Ms(0)),
        3 => (1u64..=600).prop_map(Span::Ms),
        1 => Just(Span::Forever),
    ];
    choices.push((
        1,
        drain
            .clone()
            .prop_map(|drain| Step::BeginShutdown { drain })
            .boxed(),
    ));
    choices.push((
        1,
        drain.prop_map(|drain| Step::BeginHandoff { drain }).boxed(),
    ));
    // A second signal skips the drain; before any shutdown it is a no-op.
    let draining = model.shutdown.as_ref().is_some_and(|s| !s.drained);
    choices.push((if draining { 2 } else { 1 }, Just(Step::SkipDrain).boxed()));
    choices.push((1, Just(Step::LeaseLost).boxed()));

    // A parent that can take children, any known one (maybe closing or
    // finalized), or one never registered: the last two are refused whole.
    let next = model.next_id;
    let mut parents: Vec<(u32, BoxedStrategy<Option<u64>>)> = vec![
        (3, Just(None).boxed()),
        (1, Just(Some(next + 1000)).boxed()),
    ];
    if !startable.is_empty() {
        parents.push((8, select(startable.clone()).prop_map(Some).boxed()));
    }
    if !known.is_empty() {
        parents.push((1, select(known.clone()).prop_map(Some).boxed()));
    }
    let scope_named = prop_oneof![Just(None), (0u64..2).prop_map(Some)];
    // Two scopes, so that a registration at the cap meets idle sessions
    // of its own and of another's.
    let register = (Union::new_weighted(parents), scope_named).prop_map(move |(parent, scope)| {
        Step::Register {
            session: next,
            parent,
            scope,
        }
    });
    // After shutdown one refusal is telling; a run of them is not.
    choices.push((if shutting_down { 1 } else { 14 }, register.boxed()));
    // A registration at the cap is committed, or withdrawn (the store
    // refused it), or stays in flight a while (others at the cap beside
    // it: a burst).
    let owing: Vec<u64> = model
        .sessions
        .iter()
        .filter(|(_, s)| s.room_owed)
        .map(|(id, _)| *id)
        .collect();
    if !owing.is_empty() {
        let settled = (select(owing), 0u8..3).prop_map(|(id, which)| match which {
            0 => Step::Withdraw(id),
            _ => Step::Committed(id),
        });
        choices.push((4, settled.boxed()));
    }
    // A released session adopted here: a fresh id (under a parent that may
    // take it, or one that lives elsewhere), or one this core knows or
    // handed off itself (refused).
    let mut adoptable = vec![next];
    adoptable.extend(known.iter().copied());
    adoptable.extend(model.handed_off.iter().copied());
    let last = prop_oneof![
        Just(None),
        Just(Some(Outcome::Completed)),
        Just(Some(Outcome::Cancelled)),
        Just(Some(Outcome::Interrupted)),
    ];
    let mut adopt_parents = vec![None, Some(next + 1000)];
    adopt_parents.extend(startable.iter().copied().map(Some));
    let holds = prop_oneof![
        3 => Just((0u16, 0u16)),
        1 => (0u16..2, 0u16..2),
    ];
    // Now and then with a child in the same tree: a fresh id, or one of
    // those above (refused, the tree with it).
    let child = (
        prop_oneof![4 => Just(next + 1), 1 => select(adoptable.clone())],
        0u32..4,
        last.clone(),
        holds.clone(),
        0u64..2,
        any::<bool>(),
    )
        .prop_map(
            |(session, turns, last_outcome, holds, scope, first)| AdoptedChild {
                session,
                turns,
                last_outcome,
                holds,
                scope,
                first,
            },
        );
    let adopt = (
        prop_oneof![4 => Just(next), 1 => select(adoptable)],
        select(adopt_parents),
        0u32..4,
        last,
        holds,
        0u64..2,
        prop_oneof![2 => Just(None), 1 => child.prop_map(Some)],
    )
        .prop_map(
            |(session, parent, turns, last_outcome, holds, scope, child)| Step::Adopt {
                session,
                parent,
                turns,
                last_outcome,
                holds,
                scope,
                child,
            },
        );
    choices.push((if shutting_down { 1 } else { 4 }, adopt.boxed()));
    if !model.handed_off.is_empty() {
        // Whatever a late caller still asks of a session handed off.
        let gone = select(model.handed_off.iter().copied().collect::<Vec<_>>());
        let late = (gone, 0u8..4).prop_map(|(id, which)| match which {
            0 => Step::StartTurn(id),
            1 => Step::UserClose(id),
            2 => Step::WorkEnded(WorkId::turn(SessionId(id), 1), Outcome::Completed),
            _ => Step::TransportAttached(id, false),
        });
        choices.push((2, late.boxed()));
    }

    if !turnless.is_empty() {
        choices.push((9, select(turnless).prop_map(Step::StartTurn).boxed()));
    }
    if !startable.is_empty() {
        let s = || select(startable.clone());
        // A second turn beside a running one is refused.
        choices.push((1, s().prop_map(Step::StartTurn).boxed()));
        choices.push((3, s().prop_map(Step::StartTask).boxed()));
    }
    if !attached.is_empty() {
        choices.push((
            6,
            select(attached).prop_map(Step::TransportDetached).boxed(),
        ));
    }
    if !held.is_empty() {
        let release = (select(held), hold()).prop_map(|(id, h)| Step::Release(id, h));
        choices.push((3, release.boxed()));
    }
    if !live_works.is_empty() {
        let w = || select(live_works.clone());
        choices.push((4, w().prop_map(Step::StreamAttached).boxed()));
        choices.push((2, w().prop_map(Step::StreamClosed).boxed()));
        choices.push((2, w().prop_map(Step::StartRefused).boxed()));
        choices.push((
            5,
            (w(), outcome())
                .prop_map(|(w, o)| Step::WorkEnded(w, o))
                .boxed(),
        ));
        choices.push((2, w().prop_map(Step::WorkExited).boxed()));
        choices.push((2, w().prop_map(Step::CancelWork).boxed()));
    }
    if !old_works.is_empty() {
        // Late reports from works that were detached or ended long ago.
        let late = (select(old_works), outcome(), 0u8..6).prop_map(|(w, o, which)| match which {
            0 => Step::WorkEnded(w, o),
            1 => Step::WorkExited(w),
            2 => Step::StreamAttached(w),
            3 => Step::CancelWork(w),
            4 => Step::StartRefused(w),
            _ => Step::StreamClosed(w),
        });
        choices.push((3, late.boxed()));
    }
    if !with_turn.is_empty() {
        choices.push((2, select(with_turn).prop_map(Step::CancelTurn).boxed()));
    }
    if !open.is_empty() {
        let o = || select(open.clone());
        let mode = prop_oneof![Just(CancelMode::Graceful), Just(CancelMode::Immediate)];
        choices.push((3, o().prop_map(Step::AgentFinished).boxed()));
        choices.push((1, o().prop_map(Step::Abandoned).boxed()));
        choices.push((
            2,
            (o(), select(known.clone()))
                .prop_map(|(from, to)| Step::Delegate(from, to))
                .boxed(),
        ));
        choices.push((
            2,
            (o(), mode).prop_map(|(id, m)| Step::Cancel(id, m)).boxed(),
        ));
        choices.push((1, o().prop_map(Step::CancelDescendants).boxed()));
        choices.push((1, o().prop_map(Step::UserClose).boxed()));
        choices.push((
            2,
            (o(), hold()).prop_map(|(id, h)| Step::Hold(id, h)).boxed(),
        ));
        choices.push((
            1,
            (o(), hold())
                .prop_map(|(id, h)| Step::Release(id, h))
                .boxed(),
        ));
        let cod = prop_oneof![3 => Just(false), 1 => Just(true)];
        choices.push((
            4,
            (o(), cod)
                .prop_map(|(id, c)| Step::TransportAttached(id, c))
                .boxed(),
        ));
        choices.push((1, o().prop_map(Step::TransportDetached).boxed()));
    }
    if !open.is_empty() {
        let limits = (
            prop_oneof![2 => Just(None), 1 => (0u32..4).prop_map(Some)],
            prop_oneof![2 => Just(None), 1 => (0u64..120).prop_map(Some)],
            prop_oneof![2 => Just(None), 1 => (0u64..1500).prop_map(Some)],
        );
        let budget = (select(open.clone()), limits)
            .prop_map(|(id, (turns, tokens, wall))| Step::SetBudget(id, turns, tokens, wall));
        choices.push((2, budget.boxed()));
    }
    if !live_works.is_empty() {
        let usage = (select(live_works.clone()), 0u64..60).prop_map(|(w, n)| Step::Usage(w, n));
        choices.push((3, usage.boxed()));
    }
    if !finalized.is_empty() {
        choices.push((1, select(finalized).prop_map(Step::Forget).boxed()));
    }
    if !known.is_empty() {
        // Any input at any session, finalized and forgotten ones included:
        // each must get its one answer and change nothing else.
        let any = (select(known), outcome(), hold(), any::<bool>(), 0u8..25).prop_map(
            move |(id, outcome, hold, flag, which)| {
                let turn = WorkId::turn(SessionId(id), 1);
                match which {
                    0 => Step::StartTurn(id),
                    1 => Step::StartTask(id),
                    2 => Step::StreamAttached(turn),
                    3 => Step::StreamClosed(turn),
                    4 => Step::WorkEnded(turn, outcome),
                    5 => Step::WorkExited(WorkId::task(SessionId(id), 1)),
                    6 => Step::AgentFinished(id),
                    7 => Step::Cancel(id, CancelMode::Immediate),
                    8 => Step::CancelTurn(id),
                    9 => Step::CancelDescendants(id),
                    10 => Step::UserClose(id),
                    11 => Step::Hold(id, hold),
                    12 => Step::Release(id, hold),
                    13 => Step::TransportAttached(id, flag),
                    14 => Step::TransportDetached(id),
                    15 => Step::Forget(id),
                    16 => Step::Withdraw(id),
                    17 => Step::CancelWork(turn),
                    18 => Step::Abandoned(id),
                    19 => Step::Delegate(id, id.saturating_sub(1).max(1)),
                    20 => Step::Usage(turn, 30),
                    21 => Step::SetBudget(id, Some(1), None, None),
                    22 => Step::StartRefused(turn),
                    23 => Step::Committed(id),
                    _ => Step::Register {
                        session: next,
                        parent: Some(id),
                        scope: (id % 3 != 0).then_some(id % 2),
                    },
                }
            },
        );
        choices.push((3, any.boxed()));
    }
    Union::new_weighted(choices).boxed()
}
