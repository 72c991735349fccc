//! The seed scenarios and one test per reclaim path, named after the guarantee
//! each one protects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use settle_core::{
    answer_finalized, CancelMode, Deadline, DeadlineKind, Effect, EndReason, Error, Event, Handled,
    Hold, Outcome, Policy, SessionId, ShutdownSummary, State, Sweep, WorkId,
};
use support::Harness;

#[test]
fn g1_root_finishing_settles_a_mid_turn_child_before_any_finalize() {
    let mut h = Harness::new();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    let grandchild = h.register(3, Some(2));
    h.attached_turn(child);
    h.ev(Event::StartTurn {
        session: grandchild,
    });
    h.ev(Event::StartTurn { session: root });
    h.ev(Event::WorkEnded {
        work: WorkId::turn(root, 1),
        outcome: Outcome::Completed,
    });

    let effects = {
        let _ = h
            .core
            .handle(h.now, Event::AgentFinished { session: root })
            .unwrap();
        h.drain()
    };
    // Both descendants are asked to stop, the grandchild first.
    let cancelled: Vec<SessionId> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::CancelWork { work, mode } => {
                assert_eq!(*mode, CancelMode::Immediate);
                Some(work.session)
            }
            _ => None,
        })
        .collect();
    assert_eq!(cancelled, vec![grandchild, child]);
    // Nothing is finalized while they are still live.
    assert!(h.finalized().is_empty(), "{:?}", h.finalized());
    assert_eq!(h.state(child), State::Cancelling);
    assert_eq!(h.state(root), State::Settled);

    // The child unwinds; the grandchild ignores the cancel and is detached.
    h.ev(Event::WorkEnded {
        work: WorkId::turn(child, 1),
        outcome: Outcome::Cancelled,
    });
    assert!(
        h.finalized().is_empty(),
        "the child waits for its own child"
    );
    h.advance(Duration::from_secs(1));
    assert_eq!(
        h.finalized(),
        vec![
            (grandchild, EndReason::ParentFinished),
            (child, EndReason::ParentFinished),
            (root, EndReason::Completed),
        ]
    );
    let root_end = h.finalize_of(root).unwrap();
    assert!(root_end.commit_memory, "the root's own last turn completed");
    assert_eq!(
        h.finalize_of(grandchild).unwrap().last_outcome,
        Some(Outcome::Detached)
    );
}

/// A graceful cancel of a session is graceful for its whole subtree: the
/// descendants' running turns are asked to finish (not cut) like the
/// session's own, each bounded by its settle deadline (G5), and the subtree
/// is still finalized children first (G1) once they have.
#[test]
fn g1_a_graceful_cancel_lets_the_descendants_turns_finish_before_the_parent_closes() {
    let mut h = Harness::new();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    let grandchild = h.register(3, Some(2));
    h.attached_turn(root);
    h.attached_turn(child);
    h.attached_turn(grandchild);

    let effects = h.effects_of(Event::Cancel {
        session: root,
        mode: CancelMode::Graceful,
    });
    let cancelled: Vec<(SessionId, CancelMode)> = effects
        .iter()
        .filter_map(|e| match e {
            Effect::CancelWork { work, mode } => Some((work.session, *mode)),
            _ => None,
        })
        .collect();
    let graceful = CancelMode::Graceful;
    assert_eq!(
        cancelled,
        vec![(grandchild, graceful), (child, graceful), (root, graceful)],
        "every turn of the subtree is let finish, descendants first"
    );
    assert_eq!(h.closes_of(child) + h.closes_of(grandchild), 0);

    // The child's and the grandchild's turns complete on their own.
    h.ev(Event::WorkEnded {
        work: WorkId::turn(child, 1),
        outcome: Outcome::Completed,
    });
    h.ev(Event::WorkEnded {
        work: WorkId::turn(grandchild, 1),
        outcome: Outcome::Completed,
    });
    assert!(h.finalized().iter().all(|(s, _)| *s != root));
    h.ev(Event::WorkEnded {
        work: WorkId::turn(root, 1),
        outcome: Outcome::Completed,
    });
    assert_eq!(
        h.finalized(),
        vec![
            (grandchild, EndReason::Cancelled),
            (child, EndReason::Cancelled),
            (root, EndReason::Cancelled),
        ]
    );
    for s in [grandchild, child] {
        assert!(
            h.finalize_of(s).unwrap().commit_memory,
            "a finished turn is a completed one"
        );
    }
}

/// An immediate cancel stays immediate for the whole subtree.
#[test]
fn g1_an_immediate_cancel_cuts_the_descendants_turns() {
    let mut h = Harness::new();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    h.attached_turn(child);
    let effects = h.effects_of(Event::Cancel {
        session: root,
        mode: CancelMode::Immediate,
    });
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::CancelWork { work, mode: CancelMode::Immediate } if work.session == child
    )));
}

#[test]
fn g1_cancel_descendants_never_cancels_the_caller() {
    let mut h = Harness::new();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    h.ev(Event::StartTurn { session: root });
    h.ev(Event::StartTurn { session: child });
    h.ev(Event::CancelDescendants { session: root });
    assert_eq!(h.cancels_of(root), 0);
    assert_eq!(h.cancels_of(child), 1);
    assert_eq!(h.state(root), State::Running);
    h.ev(Event::WorkExited {
        work: WorkId::turn(child, 1),
    });
    assert_eq!(h.finalized(), vec![(child, EndReason::Cancelled)]);
}

#[test]
fn g6_work_that_cancelled_itself_is_not_cancelled_again() {
    let mut h = Harness::new();
    let s = h.register(1, None);
    h.attached_turn(s);
    // The provider cancelled itself: the turn is over before anyone asked.
    h.ev(Event::WorkEnded {
        work: WorkId::turn(s, 1),
        outcome: Outcome::Cancelled,
    });
    let handled = h.ev_h(Event::Cancel {
        session: s,
        mode: CancelMode::Immediate,
    });
    assert_eq!(handled, Handled::Applied, "the session itself is cancelled");
    assert_eq!(h.cancels_of(s), 0, "but there is no work left to cancel");
    assert_eq!(h.closes_of(s), 0);
    // A second cancel of a settled session is a no-op.
    let again = h.ev_h(Event::Cancel {
        session: s,
        mode: CancelMode::Immediate,
    });
    assert_eq!(again, Handled::AlreadyFinalized);
}

#[test]
fn g6_a_second_cancel_of_a_live_work_is_a_no_op() {
    let mut h = Harness::new();
    let s = h.register(1, None);
    h.ev(Event::StartTurn { session: s });
    h.ev(Event::Cancel {
        session: s,
        mode: CancelMode::Graceful,
    });
    let again = h.ev_h(Event::Cancel {
        session: s,
        mode: CancelMode::Immediate,
    });
    assert_eq!(again, Handled::NoOp);
    h.ev(Event::UserClose { session: s });
    assert_eq!(h.cancels_of(s), 1);
}

#[test]
fn g4_cancel_during_stream_attach_still_closes_the_stream() {
    let mut h = Harness::new();
    let s = h.register(1, None);
    h.ev(Event::StartTurn { session: s });
    // The cancel lands after the run started but before its stream attached.
    h.ev(Event::Cancel {
        session: s,
        mode: CancelMode::Immediate,
    });
    assert_eq!(h.cancels_of(s), 1);
    assert_eq!(h.closes_of(s), 0, "no stream to close yet");
    h.ev(Event::StreamAttached {
        work: WorkId::turn(s, 1),
    });
    assert_eq!(h.closes_of(s), 1, "the late stream is closed at once");
    h.ev(Event::StreamClosed {
        work: WorkId::turn(s, 1),
    });
    h.ev(Event::WorkExited {
        work: WorkId::turn(s, 1),
    });
    assert_eq!(h.closes_of(s), 1, "and only once");
    assert_eq!(h.finalized(), vec![(s, EndReason::Cancelled)]);
    assert!(!h.finalize_of(s).unwrap().commit_memory);
}

#[test]
fn g5_a_work_that_ignores_cancel_is_detached_at_the_settle_deadline() {
    let mut h = Harness::with(Policy::default().settle_timeout(Duration::from_millis(250)));
    let s = h.register(1, None);
    h.attached_turn(s);
    h.ev(Event::Cancel {
        session: s,
        mode: CancelMode::Graceful,
    });
    assert_eq!(
        h.core.poll_timeout(),
        Some(Deadline {
            at: h.now + Duration::from_millis(250),
            kind: DeadlineKind::Settle
        })
    );
    h.advance(Duration::from_millis(249));
    assert_eq!(h.state(s), State::Cancelling);
    h.advance(Duration::from_millis(1));
    let work = WorkId::turn(s, 1);
    let tail: Vec<&Effect> = h
        .log
        .iter()
        .filter(|e| {
            matches!(
                e,
                Effect::CloseStream { .. } | Effect::DetachWork { .. } | Effect::EndWork { .. }
            )
        })
        .collect();
    assert_eq!(
        tail,
        vec![
            &Effect::CloseStream { work },
            &Effect::DetachWork { work },
            &Effect::EndWork {
                work,
                outcome: Outcome::Detached
            }
        ]
    );
    assert_eq!(h.finalized(), vec![(s, EndReason::Cancelled)]);
    // The detached work reporting late changes nothing: its session is gone,
    // and a work's report about a finalized session is a no-op.
    assert_eq!(
        h.core.handle(h.now, Event::WorkExited { work }),
        Ok(Handled::NoOp)
    );
    assert_eq!(h.drain(), vec![]);
}

#[test]
fn g3_shutdown_sweep_spares_running_and_finalized_sessions() {
    let mut h = Harness::new();
    let live = h.register(1, None);
    let idle = h.register(2, None);
    let done = h.register(3, None);
    h.ev(Event::UserClose { session: done });
    assert_eq!(h.finalized(), vec![(done, EndReason::UserClose)]);
    h.ev(Event::StartTurn { session: live });
    h.ev(Event::BeginShutdown {
        drain: Duration::from_secs(5),
    });
    // Only the idle one is finalized now, and the finalized one not again.
    assert_eq!(
        h.finalized(),
        vec![(done, EndReason::UserClose), (idle, EndReason::Shutdown)]
    );
    assert_eq!(h.state(live), State::Running);
    assert_eq!(
        h.cancels_of(live),
        0,
        "a running turn may finish in the drain"
    );
    // No new turn or session during shutdown.
    assert_eq!(
        h.core.handle(
            h.now,
            Event::Register {
                session: SessionId(9),
                parent: None,
                scope: None,
            }
        ),
        Err(Error::ShuttingDown)
    );
    // The live turn completes within the drain: finalized with its memory.
    h.ev(Event::WorkEnded {
        work: WorkId::turn(live, 1),
        outcome: Outcome::Completed,
    });
    let f = h.finalize_of(live).unwrap();
    assert_eq!(f.reason, EndReason::Shutdown);
    assert!(f.commit_memory);
    assert_eq!(
        h.log.last(),
        Some(&Effect::ShutdownComplete(Box::new(ShutdownSummary {
            drained: vec![live],
            cancelled: vec![],
            detached: vec![],
            lease_lost: false,
            ..ShutdownSummary::default()
        })))
    );
}

#[test]
fn g9_drain_end_cancels_running_turns_and_finalizes_without_memory() {
    let mut h = Harness::with(Policy::default().settle_timeout(Duration::from_millis(100)));
    let parent = h.register(1, None);
    let child = h.register(2, Some(1));
    h.attached_turn(child);
    h.ev(Event::BeginShutdown {
        drain: Duration::from_millis(500),
    });
    assert!(
        h.finalized().is_empty(),
        "the parent waits for its running child"
    );
    assert_eq!(h.count(|e| *e == Effect::FlushTranscripts), 1);
    h.advance(Duration::from_millis(500));
    assert_eq!(h.cancels_of(child), 1);
    assert_eq!(h.closes_of(child), 0, "its work closes it");
    h.ev(Event::WorkExited {
        work: WorkId::turn(child, 1),
    });
    assert_eq!(
        h.finalized(),
        vec![(child, EndReason::Shutdown), (parent, EndReason::Shutdown)]
    );
    assert!(!h.finalize_of(child).unwrap().commit_memory);
    assert_eq!(
        h.log.last(),
        Some(&Effect::ShutdownComplete(Box::new(ShutdownSummary {
            drained: vec![],
            cancelled: vec![child],
            detached: vec![],
            lease_lost: false,
            ..ShutdownSummary::default()
        })))
    );
}

#[test]
fn g3_a_turn_started_after_the_sweep_looked_is_not_reclaimed() {
    let ttl = Duration::from_secs(60);
    let mut h = Harness::with(Policy::default().idle_ttl(Some(ttl)));
    let s = h.register(1, None);
    // The sweeper looked: the session is due at `now + ttl`.
    let due = h.core.poll_timeout().unwrap();
    assert_eq!(due.kind, DeadlineKind::IdleReap);
    let due = due.at;
    assert_eq!(due, h.now + ttl);
    // A turn starts just before the claim.
    h.now = due - Duration::from_millis(1);
    h.ev(Event::StartTurn { session: s });
    h.now = due;
    h.core.handle_timeout(due);
    h.drain();
    assert!(h.finalized().is_empty());
    assert_eq!(h.state(s), State::Running);
}

#[test]
fn g3_idle_reap_claims_an_idle_session_and_spares_running_and_held_ones() {
    let ttl = Duration::from_secs(60);
    let mut h = Harness::with(Policy::default().idle_ttl(Some(ttl)));
    let idle = h.register(1, None);
    let running = h.register(2, None);
    let held = h.register(3, None);
    h.ev(Event::StartTurn { session: running });
    h.ev(Event::Hold {
        session: held,
        hold: Hold::PendingInput,
    });
    h.advance(ttl);
    assert_eq!(h.finalized(), vec![(idle, EndReason::IdleReap)]);
    // Once the turn ends and the hold is released, each is reaped a TTL later.
    h.ev(Event::WorkEnded {
        work: WorkId::turn(running, 1),
        outcome: Outcome::Completed,
    });
    h.ev(Event::Release {
        session: held,
        hold: Hold::PendingInput,
    });
    h.advance(ttl - Duration::from_millis(1));
    assert_eq!(h.finalized().len(), 1);
    h.advance(Duration::from_millis(1));
    let reaped: Vec<EndReason> = h.finalized().iter().map(|(_, r)| *r).collect();
    assert_eq!(reaped, vec![EndReason::IdleReap; 3]);
}

#[test]
fn g3_lru_cap_evicts_the_least_recently_active_idle_session() {
    let mut h = Harness::with(Policy::default().lru_cap(Some(2)));
    let oldest = h.register(1, None);
    h.now += Duration::from_secs(1);
    let running = h.register(2, None);
    h.ev(Event::StartTurn { session: running });
    h.now += Duration::from_secs(1);
    h.register(3, None);
    assert_eq!(h.finalized(), vec![(oldest, EndReason::LruEvict)]);
    // Over the cap again, but the only older session is mid-turn: spared.
    h.now += Duration::from_secs(1);
    h.register(4, None);
    let evicted: Vec<SessionId> = h.finalized().iter().map(|(s, _)| *s).collect();
    assert_eq!(evicted, vec![oldest, SessionId(3)]);
    assert_eq!(h.state(running), State::Running);
    assert_eq!(
        h.core.handle(h.now, Event::Sweep(Sweep::Lru)),
        Ok(Handled::NoOp)
    );
}

#[test]
fn g3_orphan_reap_waits_for_the_grace_and_re_arms_while_a_turn_runs() {
    let grace = Duration::from_secs(60);
    let mut h = Harness::with(Policy::default().orphan_grace(grace).idle_ttl(None));
    let s = h.register(1, None);
    let never_attached = h.register(2, None);
    h.ev(Event::TransportAttached {
        session: s,
        close_on_disconnect: false,
    });
    h.ev(Event::TransportDetached { session: s });
    h.ev(Event::StartTurn { session: s });
    h.advance(grace);
    assert!(h.finalized().is_empty(), "a live turn is never reaped");
    h.ev(Event::WorkEnded {
        work: WorkId::turn(s, 1),
        outcome: Outcome::Completed,
    });
    h.advance(grace);
    assert_eq!(h.finalized(), vec![(s, EndReason::OrphanReap)]);
    assert_eq!(h.state(never_attached), State::Registered);
}

#[test]
fn g3_a_zero_orphan_grace_reaps_a_busy_orphan_once_it_is_idle() {
    // Found while writing the property suite's reference model: with a zero
    // grace, the orphan reap skipped for a live turn was re-armed at `now`,
    // and `handle_timeout(now)` popped it again, forever. A zero grace now
    // means "as soon as it is idle", like a close-on-disconnect transport.
    let mut h = Harness::with(
        Policy::default()
            .orphan_grace(Duration::ZERO)
            .idle_ttl(None),
    );
    let s = h.register(1, None);
    let back = h.register(2, None);
    for session in [s, back] {
        h.attach(session);
    }
    let work = h.start_turn(s);
    h.start_turn(back);
    for session in [s, back] {
        h.ev(Event::TransportDetached { session });
    }
    // A hang fails here instead of blocking the suite.
    let (tx, rx) = std::sync::mpsc::channel();
    let (mut core, now) = (h.core, h.now);
    std::thread::spawn(move || {
        core.handle_timeout(now);
        let _ = tx.send(core);
    });
    h.core = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("handle_timeout returns");
    h.drain();
    assert_eq!(h.core.poll_timeout(), None, "nothing left to wake for");
    assert!(h.finalized().is_empty(), "G3: a live turn is never reaped");

    // A transport that comes back takes the pending reap with it.
    h.attach(back);
    h.ev(Event::WorkEnded {
        work: WorkId::turn(back, 1),
        outcome: Outcome::Completed,
    });
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Completed,
    });
    assert_eq!(h.finalized(), vec![(s, EndReason::OrphanReap)]);
    assert_eq!(h.state(back), State::Registered);
}

#[test]
fn g3_a_reattached_transport_cancels_the_orphan_reap() {
    let grace = Duration::from_secs(60);
    let mut h = Harness::with(Policy::default().orphan_grace(grace));
    let s = h.register(1, None);
    h.ev(Event::TransportAttached {
        session: s,
        close_on_disconnect: false,
    });
    h.ev(Event::TransportDetached { session: s });
    h.ev(Event::TransportAttached {
        session: s,
        close_on_disconnect: false,
    });
    h.advance(grace * 2);
    assert!(h.finalized().is_empty());
}

#[test]
fn g3_transport_closed_reclaims_at_once_or_after_the_live_turn() {
    let mut h = Harness::new();
    let idle = h.register(1, None);
    let busy = h.register(2, None);
    for s in [idle, busy] {
        h.ev(Event::TransportAttached {
            session: s,
            close_on_disconnect: true,
        });
    }
    h.ev(Event::StartTurn { session: busy });
    h.ev(Event::TransportDetached { session: idle });
    h.ev(Event::TransportDetached { session: busy });
    assert_eq!(h.finalized(), vec![(idle, EndReason::TransportClosed)]);
    h.ev(Event::WorkEnded {
        work: WorkId::turn(busy, 1),
        outcome: Outcome::Completed,
    });
    assert_eq!(
        h.finalized(),
        vec![
            (idle, EndReason::TransportClosed),
            (busy, EndReason::TransportClosed)
        ]
    );
    assert!(h.finalize_of(busy).unwrap().commit_memory);
}

#[test]
fn g3_transport_closed_reclaims_a_parent_once_its_last_child_is_finalized() {
    // Found by the property suite: the pending close was looked at only when
    // the session itself went idle (a turn ended, a hold was released), so a
    // parent whose close-on-disconnect transport dropped while it still had a
    // child stayed open for good once that child was finalized.
    let mut h = Harness::quiet();
    let parent = h.register(1, None);
    let child = h.register(2, Some(1));
    h.ev(Event::TransportAttached {
        session: parent,
        close_on_disconnect: true,
    });
    h.ev(Event::TransportDetached { session: parent });
    assert!(h.finalized().is_empty(), "G1: the child goes first");
    h.ev(Event::UserClose { session: child });
    assert_eq!(
        h.finalized(),
        vec![
            (child, EndReason::UserClose),
            (parent, EndReason::TransportClosed)
        ]
    );
}

#[test]
fn g3_user_close_cancels_first_and_finalizes_once_settled() {
    let mut h = Harness::new();
    let s = h.register(1, None);
    h.attached_turn(s);
    h.ev(Event::UserClose { session: s });
    // The cancel ends the work's token; the work closes its own stream.
    assert_eq!(h.cancels_of(s), 1);
    assert_eq!(h.closes_of(s), 0);
    assert!(h.finalized().is_empty());
    h.ev(Event::WorkEnded {
        work: WorkId::turn(s, 1),
        outcome: Outcome::Cancelled,
    });
    assert_eq!(h.finalized(), vec![(s, EndReason::UserClose)]);
    assert_eq!(
        h.ev_h(Event::UserClose { session: s }),
        Handled::AlreadyFinalized
    );
    assert_eq!(h.finalized().len(), 1, "G2: finalized once");
}

#[test]
fn g3_a_held_session_survives_every_automatic_path_until_the_drain_ends() {
    let mut h = Harness::with(
        Policy::default()
            .idle_ttl(Some(Duration::from_secs(1)))
            .lru_cap(Some(1)),
    );
    let held = h.register(1, None);
    h.ev(Event::Hold {
        session: held,
        hold: Hold::Delegation,
    });
    // At the cap, the second session is refused: the held one is not evicted for it.
    assert_eq!(
        h.try_ev(Event::Register {
            session: SessionId(2),
            parent: None,
            scope: None,
        }),
        Err(settle_core::Error::OverCapacity { cap: 1 })
    );
    h.advance(Duration::from_secs(2));
    // Nothing reaps the held one either.
    assert!(h.finalized().iter().all(|(s, _)| *s != held));
    h.ev(Event::BeginShutdown {
        drain: Duration::from_secs(1),
    });
    assert!(h.finalized().iter().all(|(s, _)| *s != held));
    h.advance(Duration::from_secs(1));
    assert!(h.finalized().contains(&(held, EndReason::Shutdown)));
}

#[test]
fn g10_g2_every_input_for_a_finalized_session_gets_its_one_answer() {
    // The table on `Event`: whatever finalized the session, ending or letting
    // go of it again is `AlreadyFinalized` (G2), using it is `SessionClosed`
    // (G10), and a work's report is a no-op (its work is gone).
    for finalize_by in 0..4 {
        let mut h = Harness::new();
        let s = h.register(1, None);
        let work = h.attached_turn(s);
        let done = match finalize_by {
            0 => Event::UserClose { session: s },
            1 => Event::AgentFinished { session: s },
            2 => Event::Cancel {
                session: s,
                mode: CancelMode::Immediate,
            },
            _ => Event::BeginShutdown {
                drain: Duration::ZERO,
            },
        };
        h.ev(done);
        h.ev(Event::WorkExited { work });
        assert_eq!(h.state(s), State::Finalized, "case {finalize_by}");

        let ends = [
            Event::AgentFinished { session: s },
            Event::Cancel {
                session: s,
                mode: CancelMode::Graceful,
            },
            Event::CancelTurn { session: s },
            Event::CancelDescendants { session: s },
            Event::UserClose { session: s },
            Event::Release {
                session: s,
                hold: Hold::PendingInput,
            },
            Event::TransportDetached { session: s },
        ];
        for event in ends {
            let answer = h.try_ev(event.clone());
            assert_eq!(answer, Ok(Handled::AlreadyFinalized), "{event:?}");
            // The same answer a handle gets once no core is left to ask.
            assert_eq!(answer_finalized(&event), Some(answer), "{event:?}");
        }
        let uses = [
            Event::StartTurn { session: s },
            Event::StartTask { session: s },
            Event::Hold {
                session: s,
                hold: Hold::PendingInput,
            },
            Event::TransportAttached {
                session: s,
                close_on_disconnect: false,
            },
        ];
        for event in uses {
            let answer = h.try_ev(event.clone());
            assert_eq!(answer, Err(Error::SessionClosed(s)), "{event:?}");
            assert_eq!(answer_finalized(&event), Some(answer), "{event:?}");
        }
        if finalize_by != 3 {
            // During a shutdown a registration is refused for that first.
            let child = Event::Register {
                session: SessionId(2),
                parent: Some(s),
                scope: None,
            };
            assert_eq!(h.try_ev(child), Err(Error::SessionClosed(s)));
        }
        let reports = [
            Event::StreamAttached { work },
            Event::StreamClosed { work },
            Event::WorkEnded {
                work,
                outcome: Outcome::Completed,
            },
            Event::WorkExited { work },
            Event::WorkExited {
                work: WorkId::task(s, 1),
            },
        ];
        for event in reports {
            let answer = h.try_ev(event.clone());
            assert_eq!(answer, Ok(Handled::NoOp), "{event:?}");
            assert_eq!(answer_finalized(&event), Some(answer), "{event:?}");
        }
        let finalizes = h.count(|e| matches!(e, Effect::Finalize(_)));
        assert_eq!(finalizes, 1, "G2: finalized once (case {finalize_by})");
        let after = h.log.iter().rposition(|e| matches!(e, Effect::Finalize(_)));
        let tail = &h.log[after.unwrap() + 1..];
        assert!(
            tail.iter()
                .all(|e| matches!(e, Effect::ShutdownComplete(_))),
            "nothing after the finalize but the end of a shutdown: {tail:?}"
        );
    }
}

#[test]
fn a_turn_cancel_keeps_the_session_open() {
    let mut h = Harness::new();
    let s = h.register(1, None);
    h.attached_turn(s);
    h.ev(Event::CancelTurn { session: s });
    assert_eq!((h.cancels_of(s), h.closes_of(s)), (1, 0));
    h.ev(Event::WorkEnded {
        work: WorkId::turn(s, 1),
        outcome: Outcome::Cancelled,
    });
    assert_eq!(h.state(s), State::Registered);
    h.ev(Event::StartTurn { session: s });
    assert_eq!(h.core.session(s).unwrap().turns(), 2);
}

#[test]
fn registration_errors_name_what_is_wrong() {
    let mut h = Harness::new();
    let root = h.register(1, None);
    let err = h
        .core
        .handle(
            h.now,
            Event::Register {
                session: root,
                parent: None,
                scope: None,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("already registered"), "{err}");
    let err = h
        .core
        .handle(
            h.now,
            Event::Register {
                session: SessionId(5),
                parent: Some(SessionId(42)),
                scope: None,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("42"), "{err}");
    h.ev(Event::AgentFinished { session: root });
    let err = h
        .core
        .handle(
            h.now,
            Event::Register {
                session: SessionId(6),
                parent: Some(root),
                scope: None,
            },
        )
        .unwrap_err();
    assert!(err.to_string().contains("finalized"), "{err}");
}

#[test]
fn deep_and_wide_trees_wind_down_without_recursion() {
    let mut h = Harness::with(Policy::default().lru_cap(None));
    let depth = 10_000u64;
    h.register(0, None);
    for i in 1..depth {
        h.register(i, Some(i - 1));
    }
    h.ev(Event::StartTurn {
        session: SessionId(depth - 1),
    });
    h.ev(Event::AgentFinished {
        session: SessionId(0),
    });
    h.ev(Event::WorkExited {
        work: WorkId::turn(SessionId(depth - 1), 1),
    });
    let order: Vec<u64> = h.finalized().iter().map(|(s, _)| s.0).collect();
    let expected: Vec<u64> = (0..depth).rev().collect();
    assert_eq!(order, expected);
}

#[test]
fn g2_an_agent_finishing_with_an_idle_child_is_finalized_once() {
    // Found by the property suite: the idle child settles and is finalized
    // inside the subtree wind-down, and the cascade from it used to finalize
    // the finishing agent too, which was then settled and finalized again.
    let mut h = Harness::new();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    h.ev(Event::AgentFinished { session: root });
    assert_eq!(
        h.finalized(),
        vec![
            (child, EndReason::ParentFinished),
            (root, EndReason::Completed)
        ]
    );
    assert_eq!(h.state(root), State::Finalized);
    assert_eq!(h.core.open_sessions(), 0);
    let root_states: Vec<(Option<State>, State)> = h
        .log
        .iter()
        .filter_map(|e| match e {
            Effect::Transition(t) if t.session == root => Some((t.from, t.to)),
            _ => None,
        })
        .collect();
    assert_eq!(
        root_states,
        vec![
            (None, State::Registered),
            (Some(State::Registered), State::Settled),
            (Some(State::Settled), State::Finalized),
        ]
    );
}

#[test]
fn g9_a_held_session_cancelled_during_the_drain_is_settled_then_finalized_shutdown() {
    // Found by the property suite: a held session closed by a user during the
    // drain must be cancelled and settled like any other, not held back as if
    // the shutdown sweep had claimed it. Since issue 11 its end reason is
    // `shutdown`, like every session finalized after shutdown began (G9); it
    // used to be the reason of the request (`cancelled`, `user_close`).
    let mut h = Harness::new();
    let held = h.register(1, None);
    let running = h.register(2, None);
    h.ev(Event::Hold {
        session: held,
        hold: Hold::PendingInput,
    });
    h.ev(Event::StartTurn { session: running });
    h.ev(Event::BeginShutdown {
        drain: Duration::from_secs(5),
    });
    assert!(h.finalized().is_empty());
    h.ev(Event::Cancel {
        session: held,
        mode: CancelMode::Graceful,
    });
    h.ev(Event::UserClose { session: running });
    h.ev(Event::WorkExited {
        work: WorkId::turn(running, 1),
    });
    assert_eq!(
        h.finalized(),
        vec![(held, EndReason::Shutdown), (running, EndReason::Shutdown)]
    );
    let held_states: Vec<(Option<State>, State)> = h
        .log
        .iter()
        .filter_map(|e| match e {
            Effect::Transition(t) if t.session == held => Some((t.from, t.to)),
            _ => None,
        })
        .collect();
    assert_eq!(
        held_states,
        vec![
            (None, State::Registered),
            (Some(State::Registered), State::Settled),
            (Some(State::Settled), State::Finalized),
        ],
        "cancelled, not reclaimed"
    );
    assert!(!h.core.is_drained());
}
