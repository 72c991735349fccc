//! Regressions of issue 11's core items, each named after its guarantee: a
//! finish after a turn cancel (item 3), a parent finishing during the drain
//! (item 2), late reports from old works (item 5), durations too long to
//! represent (item 11), and tasks, the works other than turns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use settle_core::{
    CancelMode, Cause, DeadlineKind, Effect, EndReason, Error, Event, Handled, Hold, Outcome,
    Policy, SessionId, ShutdownSummary, State, Sweep, WorkId,
};
use support::{Harness, MS, SEC};

// ----- item 3: finish() after cancel_turn() --------------------------------

#[test]
fn g7_a_finish_after_a_turn_cancel_records_the_cut_turn_cancelled_without_memory() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let work = h.attached_turn(s);
    // The user cancels the turn mid-stream, then the agent finishes.
    let cut = h.effects_of(Event::CancelTurn { session: s });
    assert_eq!(
        cut,
        vec![
            // The work closes its own stream as its token is cancelled.
            Effect::CancelWork {
                work,
                mode: CancelMode::Immediate
            },
        ]
    );
    let finish = h.effects_of(Event::AgentFinished { session: s });
    assert!(
        !finish
            .iter()
            .any(|e| matches!(e, Effect::CancelWork { .. } | Effect::EndWork { .. })),
        "G6: not cancelled again, and the turn is not declared over: {finish:?}"
    );
    assert_eq!(h.state(s), State::Cancelling, "it waits for the cut turn");
    assert!(h.finalized().is_empty());

    h.ev(Event::WorkExited { work });
    assert_eq!(h.ended(work), vec![Outcome::Cancelled]);
    let f = h.finalize_of(s).unwrap();
    assert_eq!(f.reason, EndReason::Cancelled);
    assert_eq!(f.last_outcome, Some(Outcome::Cancelled));
    assert!(!f.commit_memory, "G7: no memory from a cut turn");
    assert!(!f.completed(), "the end hook's completed flag");
    assert!(f.interrupted());
}

#[test]
fn g7_a_finish_after_a_turn_cancel_ignored_ends_detached_without_memory() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let work = h.start_turn(s);
    h.ev(Event::CancelTurn { session: s });
    h.at(500 * MS);
    h.ev(Event::AgentFinished { session: s });
    // The settle deadline is the turn cancel's, not pushed back by the finish.
    h.tick(SEC);
    assert_eq!(h.ended(work), vec![Outcome::Detached]);
    let f = h.finalize_of(s).unwrap();
    assert_eq!(
        (f.reason, f.last_outcome, f.commit_memory),
        (EndReason::Cancelled, Some(Outcome::Detached), false)
    );
}

#[test]
fn g7_a_turn_that_completes_before_the_finish_lands_keeps_its_memory() {
    // The work saw its stream end before it saw the finish's cancel: the
    // turn did complete, and its transcript is whole.
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let work = h.start_turn(s);
    h.ev(Event::AgentFinished { session: s });
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Completed,
    });
    let f = h.finalize_of(s).unwrap();
    assert_eq!((f.reason, f.commit_memory), (EndReason::Completed, true));
}

#[test]
fn g7_the_end_reason_of_a_finish_follows_the_last_turn() {
    let cases = [
        (None, EndReason::Completed),
        (Some(Outcome::Completed), EndReason::Completed),
        (Some(Outcome::Failed), EndReason::Failed),
        (Some(Outcome::IdleTimeout), EndReason::Failed),
        (Some(Outcome::Cancelled), EndReason::Cancelled),
    ];
    for (last, reason) in cases {
        let mut h = Harness::quiet();
        let s = h.register(1, None);
        if let Some(outcome) = last {
            let work = h.start_turn(s);
            h.ev(Event::WorkEnded { work, outcome });
        }
        h.ev(Event::AgentFinished { session: s });
        let f = h.finalize_of(s).unwrap();
        assert_eq!(f.reason, reason, "last turn {last:?}");
        assert_eq!(f.commit_memory, last == Some(Outcome::Completed));
    }
}

// ----- item 2: a parent finishing during the drain -------------------------

#[test]
fn g9_a_parent_finishing_during_the_drain_spares_its_childrens_turns() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    let root_turn = h.start_turn(root);
    let child_turn = h.attached_turn(child);
    h.ev(Event::BeginShutdown { drain: 10 * SEC });

    // The root's first turn completes within the drain; its second is refused,
    // so the agent finishes.
    h.at(300 * MS);
    h.ev(Event::WorkEnded {
        work: root_turn,
        outcome: Outcome::Completed,
    });
    assert_eq!(
        h.try_ev(Event::StartTurn { session: root }),
        Err(Error::ShuttingDown)
    );
    let finish = h.effects_of(Event::AgentFinished { session: root });
    assert!(
        !finish.iter().any(|e| matches!(
            e,
            Effect::CancelWork { .. } | Effect::CloseStream { .. } | Effect::Finalize(_)
        )),
        "G9: the child's turn keeps the drain: {finish:?}"
    );
    assert_eq!(h.state(child), State::Running);
    assert_eq!(h.state(root), State::Settled);

    // The child's turn completes in full within the drain.
    h.at(3200 * MS);
    h.ev(Event::WorkEnded {
        work: child_turn,
        outcome: Outcome::Completed,
    });
    assert_eq!(
        h.finalized(),
        vec![(child, EndReason::Shutdown), (root, EndReason::Shutdown)],
        "G9: every session finalized after shutdown began ends `shutdown`"
    );
    assert!(h.finalize_of(child).unwrap().commit_memory);
    assert!(h.finalize_of(root).unwrap().commit_memory);
    assert_eq!(h.cancels_of(child), 0);
    assert_eq!(
        h.log.last(),
        Some(&Effect::ShutdownComplete(Box::new(ShutdownSummary {
            drained: vec![root, child],
            cancelled: vec![],
            detached: vec![],
            lease_lost: false,
            ..ShutdownSummary::default()
        })))
    );
}

#[test]
fn g9_a_parent_finishing_during_the_drain_waits_for_the_drain_end_cut() {
    // The child's turn outlives the drain: it is cut at the drain's end like
    // any other, and both still end `shutdown`, children first (G1).
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    let child_turn = h.start_turn(child);
    h.ev(Event::BeginShutdown { drain: SEC });
    h.ev(Event::AgentFinished { session: root });
    assert_eq!(h.cancels_of(child), 0);
    h.tick(SEC);
    assert_eq!(h.cancels_of(child), 1, "cut at the end of the drain");
    h.ev(Event::WorkExited { work: child_turn });
    assert_eq!(
        h.finalized(),
        vec![(child, EndReason::Shutdown), (root, EndReason::Shutdown)]
    );
}

#[test]
fn g9_an_agent_finishing_during_the_drain_spares_the_running_work_it_delegated_to() {
    // Found by the property suite at 100,000 cases: session 1 (held, waiting
    // for a person) delegated to session 2, whose task runs. Session 1
    // finishes during the drain and is finalized: its delegation would be
    // interrupted (SPEC §4 step 6), which cancelled session 2's task in the
    // middle of the drain. The shutdown owns every session (G9): running
    // work keeps the drain, and is cut at its end like any other.
    let mut h = Harness::quiet();
    let delegator = h.register(1, None);
    let delegate = h.register(2, None);
    h.ev(Event::Hold {
        session: delegator,
        hold: settle_core::Hold::PendingInput,
    });
    let task = h.start_task(delegate);
    h.ev(Event::Delegate {
        from: delegator,
        to: delegate,
    });
    h.ev(Event::BeginShutdown { drain: SEC });
    let finish = h.effects_of(Event::AgentFinished { session: delegator });
    assert!(
        !finish
            .iter()
            .any(|e| matches!(e, Effect::CancelWork { .. })),
        "G9: the delegate's task keeps the drain: {finish:?}"
    );
    assert_eq!(h.finalized(), vec![(delegator, EndReason::Shutdown)]);
    assert_eq!(h.cancels_of(delegate), 0);

    // Cut at the drain's end, and finalized `shutdown` like every session.
    h.tick(SEC);
    assert_eq!(h.cancels_of(delegate), 1, "cut at the end of the drain");
    h.ev(Event::WorkExited { work: task });
    assert_eq!(
        h.finalized(),
        vec![
            (delegator, EndReason::Shutdown),
            (delegate, EndReason::Shutdown)
        ]
    );
}

#[test]
fn g9_a_child_finishing_during_the_drain_lets_its_finished_parent_settle() {
    // The parent finished during the drain and its own turn is over: it
    // waits only for its child to settle. The child finishes in turn but is
    // not finalized (its own held child keeps it open): it settles all the
    // same, and its parent must be looked at then.
    let mut h = Harness::quiet();
    let parent = h.register(1, None);
    let child = h.register(2, Some(1));
    let grandchild = h.register(3, Some(2));
    h.ev(Event::Hold {
        session: grandchild,
        hold: Hold::PendingInput,
    });
    let turn = h.start_turn(parent);
    h.ev(Event::BeginShutdown { drain: 10 * SEC });
    h.ev(Event::AgentFinished { session: parent });
    h.ev(Event::WorkExited { work: turn });
    assert_eq!(h.state(parent), State::Cancelling, "its child is open");
    h.ev(Event::AgentFinished { session: child });
    assert_eq!(h.state(child), State::Settled);
    assert_eq!(h.state(parent), State::Settled);
    assert!(
        h.finalized().is_empty(),
        "the held grandchild waits for the drain"
    );
    h.tick(10 * SEC);
    assert_eq!(
        h.finalized(),
        vec![
            (grandchild, EndReason::Shutdown),
            (child, EndReason::Shutdown),
            (parent, EndReason::Shutdown)
        ]
    );
}

#[test]
fn g9_every_session_finalized_after_shutdown_began_ends_shutdown_whatever_asked() {
    let mut h = Harness::quiet();
    let ids: Vec<SessionId> = (1..=4).map(|i| h.register(i, None)).collect();
    let works: Vec<WorkId> = ids.iter().map(|s| h.start_turn(*s)).collect();
    h.ev(Event::BeginShutdown { drain: 60 * SEC });
    h.ev(Event::AgentFinished { session: ids[0] });
    h.ev(Event::UserClose { session: ids[1] });
    h.ev(Event::Cancel {
        session: ids[2],
        mode: CancelMode::Graceful,
    });
    for work in &works {
        h.ev(Event::WorkExited { work: *work });
    }
    let reasons: Vec<EndReason> = h.finalized().iter().map(|(_, r)| *r).collect();
    assert_eq!(reasons, vec![EndReason::Shutdown; 4]);
}

// ----- item 5: late reports from old works ---------------------------------

#[test]
fn g5_a_late_report_from_a_detached_work_is_a_no_op_on_the_current_one() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let old = h.start_turn(s);
    h.ev(Event::CancelTurn { session: s });
    h.tick(SEC);
    assert!(h.log.contains(&Effect::DetachWork { work: old }));
    let current = h.attached_turn(s);
    assert_eq!(current, WorkId::turn(s, 2));

    for late in [
        Event::WorkEnded {
            work: old,
            outcome: Outcome::Completed,
        },
        Event::WorkExited { work: old },
        Event::StreamAttached { work: old },
        Event::StreamClosed { work: old },
    ] {
        let before = h.log.len();
        assert_eq!(h.try_ev(late.clone()), Ok(Handled::NoOp), "{late:?}");
        assert_eq!(h.log.len(), before, "{late:?} changed something");
    }
    let view = h.core.session(s).unwrap();
    assert_eq!(view.state(), State::Running);
    assert_eq!(view.work(), Some(current));
    assert_eq!(view.last_outcome(), Some(Outcome::Detached));

    // The current turn still ends on its own report, with its own outcome.
    h.ev(Event::WorkEnded {
        work: current,
        outcome: Outcome::Failed,
    });
    assert_eq!(h.ended(current), vec![Outcome::Failed]);
    assert_eq!(h.ended(old), vec![Outcome::Detached]);
    assert_eq!(h.state(s), State::Registered);
}

#[test]
fn g6_a_late_report_from_an_ended_turn_does_not_end_or_cancel_the_next() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let first = h.start_turn(s);
    h.ev(Event::WorkEnded {
        work: first,
        outcome: Outcome::Completed,
    });
    let second = h.start_turn(s);
    assert_eq!(
        h.try_ev(Event::WorkExited { work: first }),
        Ok(Handled::NoOp)
    );
    // A report naming a work that never started is as harmless.
    let never = WorkId::turn(s, 9);
    assert_eq!(
        h.try_ev(Event::WorkExited { work: never }),
        Ok(Handled::NoOp)
    );
    assert_eq!(h.core.session(s).unwrap().work(), Some(second));
    h.ev(Event::CancelTurn { session: s });
    assert_eq!(h.cancels_of(s), 1, "the second turn, once");
    assert_eq!(h.ended(first), vec![Outcome::Completed]);
}

#[test]
fn a_report_about_an_unknown_session_is_refused() {
    let mut h = Harness::quiet();
    let work = WorkId::turn(SessionId(7), 1);
    assert_eq!(
        h.try_ev(Event::WorkExited { work }),
        Err(Error::UnknownSession(SessionId(7)))
    );
}

// ----- item 11: durations too long to represent mean "never" ---------------

fn forever() -> Policy {
    Policy::default()
        .settle_timeout(Duration::MAX)
        .idle_ttl(Some(Duration::MAX))
        .lru_cap(None)
        .orphan_grace(Duration::MAX)
}

#[test]
fn g5_a_settle_timeout_too_long_to_represent_never_detaches_and_never_panics() {
    for settle_timeout in [Duration::MAX, Duration::from_secs(u64::MAX)] {
        let mut h = Harness::with(forever().settle_timeout(settle_timeout));
        let s = h.register(1, None);
        let work = h.start_turn(s);
        let task = h.start_task(s);
        h.ev(Event::Cancel {
            session: s,
            mode: CancelMode::Immediate,
        });
        assert_eq!(h.cancels_of(s), 2);
        assert_eq!(h.core.session(s).unwrap().settle_deadline(), None);
        assert_eq!(h.core.poll_timeout(), None, "nothing to wake for");
        h.advance(Duration::from_secs(10 * 365 * 24 * 3600));
        assert_eq!(h.detaches_of(s), 0);
        h.ev(Event::WorkExited { work });
        h.ev(Event::WorkExited { work: task });
        assert_eq!(h.finalized(), vec![(s, EndReason::Cancelled)]);
    }
}

#[test]
fn g3_an_idle_ttl_and_orphan_grace_too_long_to_represent_never_reap() {
    let mut h = Harness::with(forever());
    let s = h.register(1, None);
    h.attach(s);
    h.ev(Event::TransportDetached { session: s });
    assert_eq!(h.core.poll_timeout(), None);
    h.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    for sweep in [Sweep::Idle, Sweep::Lru, Sweep::Orphan] {
        assert_eq!(h.try_ev(Event::Sweep(sweep)), Ok(Handled::NoOp));
    }
    assert_eq!(h.state(s), State::Registered);
}

#[test]
fn g9_a_drain_too_long_to_represent_lasts_until_skipped() {
    let mut h = Harness::with(forever());
    let s = h.register(1, None);
    let work = h.start_turn(s);
    h.ev(Event::BeginShutdown {
        drain: Duration::MAX,
    });
    assert_eq!(h.core.poll_timeout(), None);
    h.advance(Duration::from_secs(10 * 365 * 24 * 3600));
    assert!(!h.core.is_drained());
    assert_eq!(h.cancels_of(s), 0);
    assert_eq!(h.ev_h(Event::SkipDrain), Handled::Applied);
    assert_eq!(h.cancels_of(s), 1);
    h.ev(Event::WorkExited { work });
    assert_eq!(h.finalized(), vec![(s, EndReason::Shutdown)]);
}

#[test]
fn every_deadline_says_why() {
    let mut h = Harness::with(
        Policy::default()
            .settle_timeout(3 * SEC)
            .idle_ttl(Some(4 * SEC))
            .lru_cap(None)
            .orphan_grace(2 * SEC),
    );
    let idle = h.register(1, None);
    let busy = h.register(2, None);
    h.start_turn(busy);
    h.attach(idle);
    h.ev(Event::TransportDetached { session: idle });
    h.ev(Event::CancelTurn { session: busy });
    let mut seen = Vec::new();
    while let Some(d) = h.core.poll_timeout() {
        seen.push((d.at - h.start, d.kind));
        h.now = d.at;
        h.wake();
    }
    assert_eq!(
        seen,
        vec![
            (2 * SEC, DeadlineKind::Orphan),
            (3 * SEC, DeadlineKind::Settle),
            (7 * SEC, DeadlineKind::IdleReap),
        ]
    );
    h.ev(Event::BeginShutdown { drain: 5 * SEC });
    let d = h.core.poll_timeout().unwrap();
    assert_eq!((d.at - h.now, d.kind), (5 * SEC, DeadlineKind::Drain));
}

// ----- tasks ---------------------------------------------------------------

#[test]
fn g5_a_task_that_ignores_its_cancel_is_detached_at_its_settle_deadline() {
    let mut h = Harness::quiet(); // settle timeout 1 s
    let s = h.register(1, None);
    let task = h.start_task(s);
    assert_eq!(task, WorkId::task(s, 1));
    assert_eq!(h.state(s), State::Running);
    h.ev(Event::Cancel {
        session: s,
        mode: CancelMode::Graceful,
    });
    let deadline = h.core.poll_timeout().unwrap();
    assert_eq!(
        (deadline.at, deadline.kind),
        (h.start + SEC, DeadlineKind::Settle)
    );
    h.tick(SEC - MS);
    assert_eq!(h.detaches_of(s), 0);
    h.tick(SEC);
    assert!(h.log.contains(&Effect::DetachWork { work: task }));
    assert_eq!(h.ended(task), vec![Outcome::Detached]);
    assert_eq!(h.closes_of(s), 0, "no stream attached, none to close");
    let f = h.finalize_of(s).unwrap();
    assert_eq!(f.reason, EndReason::Cancelled);
    assert_eq!(f.last_outcome, None, "a task is not a turn");
}

#[test]
fn g3_a_session_with_a_live_task_is_never_reclaimed() {
    let mut h = Harness::with(
        Policy::default()
            .idle_ttl(Some(SEC))
            .lru_cap(Some(1))
            .orphan_grace(SEC),
    );
    let s = h.register(1, None);
    let task = h.start_task(s);
    h.attach(s);
    h.ev(Event::TransportDetached { session: s });
    h.tick(10 * SEC);
    // At the cap with nothing to evict: the newcomer is refused, never
    // registered to be evicted at birth.
    assert_eq!(
        h.try_ev(Event::Register {
            session: SessionId(2),
            parent: None,
            scope: None,
        }),
        Err(Error::OverCapacity { cap: 1 })
    );
    for sweep in [Sweep::Idle, Sweep::Lru, Sweep::Orphan] {
        h.ev(Event::Sweep(sweep));
    }
    h.tick(20 * SEC);
    assert_eq!(h.finalized(), vec![]);
    assert_eq!(h.state(s), State::Running);
    assert_eq!(h.core.session(s).unwrap().closing(), None);

    // Once the task ends, the reclaims may take it.
    h.ev(Event::WorkEnded {
        work: task,
        outcome: Outcome::Completed,
    });
    let to_registered = h.log.iter().any(|e| {
        matches!(e, Effect::Transition(t) if t.session == s
            && t.to == State::Registered
            && t.cause == Cause::TaskEnded(Outcome::Completed))
    });
    assert!(to_registered);
    h.tick(21 * SEC);
    assert_eq!(h.state(s), State::Finalized);
}

#[test]
fn g1_a_child_with_a_live_task_keeps_its_parent_open() {
    let mut h = Harness::quiet();
    let parent = h.register(1, None);
    let child = h.register(2, Some(1));
    let task = h.start_task(child);
    h.ev(Event::AgentFinished { session: parent });
    assert_eq!(h.state(parent), State::Settled);
    assert_eq!(h.state(child), State::Cancelling);
    assert!(h.log.contains(&Effect::CancelWork {
        work: task,
        mode: CancelMode::Immediate
    }));
    assert!(h.finalized().is_empty(), "G1: the child's task is live");
    h.tick(SEC);
    assert_eq!(
        h.finalized(),
        vec![
            (child, EndReason::ParentFinished),
            (parent, EndReason::Completed)
        ]
    );
}

#[test]
fn a_task_beside_a_turn_keeps_the_session_running_until_both_end() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let turn = h.start_turn(s);
    let task = h.start_task(s);
    let second = h.start_task(s);
    assert_eq!(second, WorkId::task(s, 2));
    assert_eq!(
        h.try_ev(Event::StartTurn { session: s }),
        Err(Error::WrongState {
            session: s,
            state: State::Running,
            action: "start a turn"
        }),
        "one turn at a time"
    );
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Completed,
    });
    assert_eq!(h.state(s), State::Running, "its tasks are still live");
    // A turn may start again beside the tasks.
    let next = h.start_turn(s);
    assert_eq!(next, WorkId::turn(s, 2));
    h.ev(Event::CancelTurn { session: s });
    assert_eq!(h.cancels_of(s), 1, "a turn cancel leaves the tasks alone");
    for work in [task, second, next] {
        h.ev(Event::WorkExited { work });
    }
    assert_eq!(h.ended(task), vec![Outcome::Failed], "exited uncancelled");
    assert_eq!(h.ended(next), vec![Outcome::Cancelled]);
    assert_eq!(h.state(s), State::Registered);
    assert_eq!(
        h.core.session(s).unwrap().last_outcome(),
        Some(Outcome::Cancelled)
    );
}

#[test]
fn g1_g6_a_finishing_agent_cancels_each_of_its_works_once() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let turn = h.start_turn(s);
    let task = h.start_task(s);
    h.ev(Event::StreamAttached { work: turn });
    let effects = h.effects_of(Event::AgentFinished { session: s });
    let orders: Vec<&Effect> = effects
        .iter()
        .filter(|e| !matches!(e, Effect::Transition(_)))
        .collect();
    assert_eq!(
        orders,
        vec![
            &Effect::CancelWork {
                work: turn,
                mode: CancelMode::Immediate
            },
            &Effect::CancelWork {
                work: task,
                mode: CancelMode::Immediate
            },
        ]
    );
    h.ev(Event::UserClose { session: s });
    assert_eq!(h.cancels_of(s), 2, "G6");
}
