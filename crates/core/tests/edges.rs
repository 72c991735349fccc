//! The edges of the lifecycle that the seed scenarios do not reach: exact
//! deadline boundaries, replaced deadlines, what each input reports when it
//! has nothing to do, forgetting finalized sessions, and every public
//! accessor. Each test is named after the behaviour it protects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use settle_core::{
    Adoptee, CancelMode, Cause, Deadline, DeadlineKind, Effect, EndReason, Error, Event, Finalize,
    Handled, Hold, Outcome, Policy, Scope, SessionId, State, Sweep, TurnError, TurnErrorKind,
    WorkId,
};
use support::{Harness, MS, SEC};

// ----- the vocabulary and the accessors ------------------------------------

#[test]
fn vocabulary_predicates_pick_exactly_their_words() {
    let live: Vec<State> = State::ALL.iter().copied().filter(|s| s.is_live()).collect();
    assert_eq!(live, vec![State::Running, State::Cancelling]);

    let complete: Vec<Outcome> = Outcome::ALL
        .iter()
        .copied()
        .filter(|o| o.is_complete())
        .collect();
    assert_eq!(complete, vec![Outcome::Completed]);

    let interrupted: Vec<Outcome> = Outcome::ALL
        .iter()
        .copied()
        .filter(|o| o.is_interrupted())
        .collect();
    assert_eq!(
        interrupted,
        vec![Outcome::Cancelled, Outcome::Detached, Outcome::Interrupted]
    );

    let reclaims: Vec<EndReason> = EndReason::ALL
        .iter()
        .copied()
        .filter(|r| r.is_reclaim())
        .collect();
    assert_eq!(
        reclaims,
        vec![
            EndReason::IdleReap,
            EndReason::LruEvict,
            EndReason::OrphanReap,
            EndReason::TransportClosed,
            EndReason::Shutdown,
        ]
    );
}

#[test]
fn end_hook_flags_follow_the_last_outcome() {
    let flags = |last_outcome| {
        let f = Finalize {
            session: SessionId(1),
            reason: EndReason::Completed,
            last_outcome,
            outcome: last_outcome,
            commit_memory: false,
            in_shutdown: false,
        };
        (f.completed(), f.interrupted())
    };
    assert_eq!(flags(None), (false, false));
    assert_eq!(flags(Some(Outcome::Completed)), (true, false));
    assert_eq!(flags(Some(Outcome::Failed)), (false, false));
    assert_eq!(flags(Some(Outcome::IdleTimeout)), (false, false));
    for o in [Outcome::Cancelled, Outcome::Detached, Outcome::Interrupted] {
        assert_eq!(flags(Some(o)), (false, true), "{o}");
    }
}

#[test]
fn every_cause_reads_as_words_on_the_timeline() {
    let cases = [
        (Cause::Registered, "registered"),
        (Cause::TurnStarted, "turn started"),
        (Cause::TaskStarted, "task started"),
        (
            Cause::TurnEnded(Outcome::IdleTimeout),
            "turn ended: idle_timeout",
        ),
        (Cause::TaskEnded(Outcome::Failed), "task ended: failed"),
        (Cause::AgentFinished, "agent finished"),
        (
            Cause::CancelRequested(CancelMode::Graceful),
            "cancel requested (graceful)",
        ),
        (Cause::UserClose, "closed by user"),
        (Cause::AncestorWindingDown, "ancestor winding down"),
        (Cause::DescendantsSettled, "descendants settled"),
        (
            Cause::SettleDeadline,
            "settle deadline passed: work detached",
        ),
        (Cause::DrainEnded, "drain ended: cancelled"),
        (
            Cause::Finalized(EndReason::OrphanReap),
            "finalized: orphan_reap",
        ),
    ];
    for (cause, text) in cases {
        assert_eq!(cause.to_string(), text);
    }
}

#[test]
fn a_turn_error_reads_as_its_message() {
    let e = TurnError::new(TurnErrorKind::HttpStatus, "HTTP 404 Not Found");
    assert_eq!(e.to_string(), "HTTP 404 Not Found");
    assert_eq!(e.kind, TurnErrorKind::HttpStatus);
}

#[test]
fn ids_read_and_print_as_their_numbers() {
    let s: SessionId = "42".parse().unwrap();
    assert_eq!(s, SessionId::from(42));
    assert_eq!(s.get(), 42);
    assert_eq!(format!("[{s:>4}]"), "[  42]", "widths apply");
    assert!("x".parse::<SessionId>().is_err());
    let turn = WorkId::turn(s, 3);
    let task = WorkId::task(s, 2);
    assert_eq!(turn.to_string(), "session 42 turn 3");
    assert_eq!(task.to_string(), "session 42 task 2");
    assert_eq!((turn.turn_no(), task.turn_no()), (Some(3), None));
}

#[test]
fn the_core_reports_its_policy_and_open_session_count() {
    let policy = Policy::default()
        .settle_timeout(Duration::from_millis(250))
        .idle_ttl(None)
        .lru_cap(Some(7))
        .orphan_grace(Duration::from_secs(5));
    let mut h = Harness::with(policy.clone());
    assert_eq!(h.core.policy(), &policy);
    assert_eq!(h.core.open_sessions(), 0);
    let a = h.register(1, None);
    h.register(2, None);
    h.register(3, Some(2));
    assert_eq!(h.core.open_sessions(), 3);
    h.ev(Event::UserClose { session: a });
    assert_eq!(h.core.open_sessions(), 2);
}

#[test]
fn a_session_view_reports_tree_work_holds_transports_and_deadline() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let a = h.register(2, Some(1));
    let b = h.register(3, Some(1));
    let r = h.core.session(root).unwrap();
    assert_eq!(r.parent(), None);
    assert_eq!(r.children().collect::<Vec<_>>(), [a, b]);
    assert_eq!(h.core.session(a).unwrap().parent(), Some(root));
    assert_eq!(h.core.session(a).unwrap().children().count(), 0);

    let view = h.core.session(a).unwrap();
    assert_eq!(
        (view.is_held(), view.transports(), view.work_cancel()),
        (false, 0, None)
    );
    assert_eq!(view.settle_deadline(), None);

    h.ev(Event::Hold {
        session: a,
        hold: Hold::Delegation,
    });
    h.attach(a);
    h.attach(a);
    h.ev(Event::StartTurn { session: a });
    assert_eq!(h.core.session(a).unwrap().work_cancel(), None);
    h.at(SEC);
    h.ev(Event::Cancel {
        session: a,
        mode: CancelMode::Graceful,
    });
    let view = h.core.session(a).unwrap();
    assert!(view.is_held());
    assert_eq!(view.transports(), 2);
    assert_eq!(view.work_cancel(), Some(CancelMode::Graceful));
    assert_eq!(view.settle_deadline(), Some(h.start + 2 * SEC));
    assert!(view.state().is_live());
}

// ----- forget ----------------------------------------------------------------

/// A process that finalizes and forgets sessions much faster than the idle
/// TTL (a gateway) keeps nothing per forgotten session: the idle index and
/// the timers drop a forgotten session's entries once they could be half of
/// the table, instead of when they surface an hour later.
/// Runs a turn of `s` that is cancelled (arming its settle deadline) and
/// ends, then closes `s`: it is finalized with a timer and an idle entry
/// left behind for the compaction to drop.
fn close_after_a_cancelled_turn(h: &mut Harness, s: SessionId) {
    let work = h.start_turn(s);
    h.ev(Event::CancelTurn { session: s });
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Cancelled,
    });
    h.ev(Event::UserClose { session: s });
}

#[test]
fn forgotten_sessions_leave_no_deadline_entries_behind() {
    let mut h = Harness::new();
    let live = h.register(1, None);
    for id in 2..10_002 {
        let s = h.register(id, None);
        close_after_a_cancelled_turn(&mut h, s);
        assert_eq!(h.state(s), State::Finalized);
        assert!(h.core.forget(s));
    }
    assert_eq!(h.core.sessions().count(), 1);
    assert!(
        h.core.idle_entries() <= 2 + 64,
        "{} idle entries for one live session",
        h.core.idle_entries()
    );
    assert!(
        h.core.deadline_entries() <= 2 + 64,
        "{} timers for one live session",
        h.core.deadline_entries()
    );
    // The live session is untouched.
    assert_eq!(h.state(live), State::Registered);
}

/// The compaction that drops forgotten sessions' entries keeps every entry
/// of a session still kept: its settle deadline still detaches (G5) and its
/// idle TTL still reaps it (G3).
#[test]
fn g3_g5_the_deadlines_of_kept_sessions_outlive_the_compaction_of_forgotten_ones() {
    let mut h = Harness::with(Policy::default().lru_cap(None));
    let idle = h.register(1, None);
    let busy = h.register(2, None);
    let work = h.attached_turn(busy);
    h.ev(Event::CancelTurn { session: busy });
    for id in 3..5_003 {
        let s = h.register(id, None);
        close_after_a_cancelled_turn(&mut h, s);
        assert!(h.core.forget(s));
    }
    assert!(h.core.idle_entries() <= 4 + 64 && h.core.deadline_entries() <= 4 + 64);
    // The settle timeout of the default policy is one second.
    h.advance(SEC);
    assert_eq!(h.detaches_of(busy), 1, "{work:?} detached at its deadline");
    h.advance(30 * 60 * SEC);
    assert_eq!(
        h.finalize_of(idle).map(|f| f.reason),
        Some(EndReason::IdleReap)
    );
}

/// Sessions registered in batches and forgotten together leave no entries
/// behind either: between two forgets the tables may have grown past any
/// one size.
#[test]
fn forgotten_batches_of_sessions_leave_no_deadline_entries_behind() {
    let mut h = Harness::with(Policy::default().lru_cap(None));
    let live = h.register(1, None);
    let mut next = 2;
    for _ in 0..25 {
        let batch: Vec<_> = (next..next + 201).map(|id| h.register(id, None)).collect();
        next += 201;
        for &s in &batch {
            close_after_a_cancelled_turn(&mut h, s);
        }
        for s in batch {
            assert!(h.core.forget(s));
        }
    }
    let (idle, timers) = (h.core.idle_entries(), h.core.deadline_entries());
    assert!(
        idle < 1_000 && timers < 1_000,
        "{idle} idle entries and {timers} timers for one live session"
    );
    assert_eq!(h.state(live), State::Registered);
}

/// A session with many deadlines of its own does not stop the timers of
/// forgotten sessions from being dropped.
#[test]
fn forgotten_sessions_leave_no_timers_behind_a_session_with_many() {
    let mut h = Harness::with(Policy::default().lru_cap(None).settle_timeout(3_600 * SEC));
    let busy = h.register(1, None);
    for _ in 0..100 {
        h.start_task(busy);
    }
    h.ev(Event::Cancel {
        session: busy,
        mode: CancelMode::Immediate,
    });
    assert_eq!(h.core.deadline_entries(), 100);
    for id in 2..5_002 {
        let s = h.register(id, None);
        close_after_a_cancelled_turn(&mut h, s);
        assert!(h.core.forget(s));
    }
    let timers = h.core.deadline_entries();
    assert!(timers <= 2 * 100 + 64, "{timers} timers for 100 live ones");
}

/// The idle index holds one entry per reclaimable session, so that the
/// bounds above say something.
#[test]
fn the_idle_index_holds_an_entry_per_idle_session() {
    let mut h = Harness::new();
    for id in 1..=3 {
        h.register(id, None);
        assert_eq!(h.core.idle_entries(), id as usize);
    }
}

/// Withdrawn registrations are not forgotten, only dropped: their entries go
/// with the compaction too.
#[test]
fn withdrawn_registrations_leave_no_deadline_entries_behind() {
    let mut h = Harness::with(Policy::default().lru_cap(None));
    for id in 1..5_001 {
        let s = h.register(id, None);
        assert_eq!(
            h.try_ev(Event::Withdraw { session: s }),
            Ok(Handled::Applied)
        );
    }
    let last = h.register(5_001, None);
    h.ev(Event::UserClose { session: last });
    assert!(h.core.forget(last));
    assert_eq!(h.core.sessions().count(), 0);
    assert!(
        h.core.idle_entries() <= 64,
        "{} idle entries for no session",
        h.core.idle_entries()
    );
}

#[test]
fn forget_drops_only_finalized_sessions_and_unlinks_them_from_their_parent() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let gone = h.register(2, Some(1));
    let kept = h.register(3, Some(1));

    assert!(!h.core.forget(gone), "an open session is kept");
    assert!(
        !h.core.forget(SessionId(99)),
        "an unknown id is not dropped"
    );
    assert_eq!(h.state(gone), State::Registered);

    h.ev(Event::UserClose { session: gone });
    assert_eq!(h.state(gone), State::Finalized);
    assert!(h.core.forget(gone));
    assert!(h.core.session(gone).is_none());
    assert_eq!(
        h.core.session(root).unwrap().children().collect::<Vec<_>>(),
        [kept]
    );
    assert_eq!(h.core.sessions().count(), 2);
    assert!(!h.core.forget(gone), "already forgotten");

    // Forgotten is still finalized: the answer table, not "not known" (G10).
    assert_eq!(h.core.state(gone), Some(State::Finalized));
    assert_eq!(
        h.try_ev(Event::StartTurn { session: gone }),
        Err(Error::SessionClosed(gone))
    );
    assert_eq!(
        h.try_ev(Event::UserClose { session: gone }),
        Ok(Handled::AlreadyFinalized)
    );
    assert_eq!(
        h.try_ev(Event::Register {
            session: gone,
            parent: None,
            scope: None,
        }),
        Err(Error::DuplicateSession(gone)),
        "a forgotten id is never registered again"
    );
    assert_eq!(h.core.state(SessionId(99)), None, "never registered");
    // The rest of the tree is untouched and still works.
    assert_eq!(h.state(kept), State::Registered);
    assert_eq!(
        h.ev_h(Event::StartTurn { session: kept }),
        Handled::Started(WorkId::turn(kept, 1))
    );
}

// ----- timers ------------------------------------------------------------------

#[test]
fn g5_a_replaced_settle_deadline_does_not_detach_the_next_turn() {
    let mut h = Harness::quiet(); // settle timeout 1 s
    let s = h.register(1, None);
    let first = h.start_turn(s);
    h.ev(Event::CancelTurn { session: s }); // settle deadline at 1 s
    h.at(500 * MS);
    h.ev(Event::WorkEnded {
        work: first,
        outcome: Outcome::Cancelled,
    });
    h.at(600 * MS);
    let second = h.start_turn(s);
    assert_eq!(second, WorkId::turn(s, 2));
    h.ev(Event::CancelTurn { session: s }); // settle deadline at 1.6 s

    h.tick(SEC);
    assert_eq!(h.detaches_of(s), 0, "the first turn's deadline fired");
    assert_eq!(h.state(s), State::Running);
    assert_eq!(h.core.session(s).unwrap().work(), Some(second));

    h.tick(1599 * MS);
    assert_eq!(h.detaches_of(s), 0);
    h.tick(1600 * MS);
    assert!(h.log.contains(&Effect::DetachWork { work: second }));
    assert_eq!(h.detaches_of(s), 1);
    assert_eq!(h.ended(second), vec![Outcome::Detached]);
    assert_eq!(h.state(s), State::Registered);
    assert_eq!(
        h.core.session(s).unwrap().last_outcome(),
        Some(Outcome::Detached)
    );
}

#[test]
fn g3_a_replaced_orphan_deadline_does_not_fire_only_the_last_one_does() {
    let mut h = Harness::quiet(); // orphan grace 60 s
    let s = h.register(1, None);
    h.attach(s);
    h.ev(Event::TransportDetached { session: s }); // orphan at 60 s
    h.at(30 * SEC);
    h.attach(s);
    h.at(40 * SEC);
    h.ev(Event::TransportDetached { session: s }); // orphan at 100 s

    h.tick(60 * SEC);
    assert!(h.finalized().is_empty(), "the replaced deadline fired");
    h.tick(100 * SEC - MS);
    assert!(h.finalized().is_empty(), "reaped before the grace ran out");
    h.tick(100 * SEC);
    assert_eq!(h.finalized(), vec![(s, EndReason::OrphanReap)]);
}

#[test]
fn g3_a_replaced_orphan_deadline_behind_a_live_one_does_not_fire() {
    // The stale entry is not on top of the deadline table when it comes due:
    // another session's live deadline is earlier, so only the guard on the
    // session's current deadline keeps it from firing.
    let mut h = Harness::quiet(); // orphan grace 60 s
    let other = h.register(1, None);
    let s = h.register(2, None);
    h.attach(other);
    h.attach(s);
    h.ev(Event::TransportDetached { session: other }); // orphan at 60 s
    h.at(5 * SEC);
    h.ev(Event::TransportDetached { session: s }); // orphan at 65 s
    h.at(30 * SEC);
    h.attach(s);
    h.at(40 * SEC);
    h.ev(Event::TransportDetached { session: s }); // orphan at 100 s

    h.tick(70 * SEC);
    assert_eq!(h.finalized(), vec![(other, EndReason::OrphanReap)]);
    assert_eq!(h.state(s), State::Registered, "the replaced deadline fired");
    h.tick(100 * SEC);
    assert_eq!(
        h.finalized(),
        vec![(other, EndReason::OrphanReap), (s, EndReason::OrphanReap)]
    );
}

#[test]
fn g5_a_replaced_settle_deadline_behind_a_live_one_does_not_fire() {
    let mut h = Harness::quiet(); // settle timeout 1 s
    let other = h.register(1, None);
    let s = h.register(2, None);
    h.ev(Event::StartTurn { session: other });
    h.ev(Event::CancelTurn { session: other }); // settle at 1 s
    h.at(100 * MS);
    h.ev(Event::StartTurn { session: s });
    h.ev(Event::CancelTurn { session: s }); // settle at 1.1 s
    h.at(200 * MS);
    h.ev(Event::WorkEnded {
        work: WorkId::turn(s, 1),
        outcome: Outcome::Cancelled,
    });
    h.at(300 * MS);
    h.ev(Event::StartTurn { session: s });
    h.ev(Event::CancelTurn { session: s }); // settle at 1.3 s

    h.tick(1200 * MS);
    assert_eq!(h.detaches_of(other), 1);
    assert_eq!(h.detaches_of(s), 0, "the replaced deadline fired");
    h.tick(1300 * MS);
    assert_eq!(h.detaches_of(s), 1);
}

#[test]
fn g3_one_of_two_transports_leaving_arms_no_orphan_reap() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.attach(s);
    h.attach(s);
    assert_eq!(
        h.ev_h(Event::TransportDetached { session: s }),
        Handled::Applied
    );
    assert_eq!(h.core.session(s).unwrap().transports(), 1);
    assert_eq!(h.core.poll_timeout(), None, "no orphan deadline is armed");
    h.tick(600 * SEC);
    assert!(h.finalized().is_empty());

    assert_eq!(
        h.ev_h(Event::TransportDetached { session: s }),
        Handled::Applied
    );
    assert_eq!(
        h.core.poll_timeout(),
        Some(Deadline {
            at: h.now + 60 * SEC,
            kind: DeadlineKind::Orphan
        })
    );
    assert_eq!(
        h.ev_h(Event::TransportDetached { session: s }),
        Handled::NoOp,
        "no transport left to detach"
    );
}

#[test]
fn g3_an_orphan_skipped_for_its_live_turn_is_not_claimed_and_may_start_another() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.attach(s);
    let first = h.start_turn(s);
    h.ev(Event::TransportDetached { session: s }); // orphan at 60 s
    h.tick(60 * SEC);
    assert_eq!(
        h.core.session(s).unwrap().closing(),
        None,
        "G3: not claimed"
    );
    h.at(61 * SEC);
    h.ev(Event::WorkEnded {
        work: first,
        outcome: Outcome::Completed,
    });
    assert_eq!(h.state(s), State::Registered, "still open after its turn");
    h.at(62 * SEC);
    let second = h.start_turn(s);
    h.at(63 * SEC);
    h.ev(Event::WorkEnded {
        work: second,
        outcome: Outcome::Completed,
    });
    // The re-armed deadline (60 s + grace) reaps it.
    h.tick(120 * SEC - MS);
    assert!(h.finalized().is_empty());
    h.tick(120 * SEC);
    assert_eq!(h.finalized(), vec![(s, EndReason::OrphanReap)]);
}

#[test]
fn g9_an_orphan_deadline_during_shutdown_is_not_re_armed() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.attach(s);
    h.ev(Event::Hold {
        session: s,
        hold: Hold::PendingInput,
    });
    h.ev(Event::TransportDetached { session: s }); // orphan at 60 s
    h.at(SEC);
    h.ev(Event::BeginShutdown {
        drain: Duration::from_secs(1000),
    });
    assert_eq!(
        h.state(s),
        State::Registered,
        "held: spared until the drain"
    );
    h.tick(60 * SEC);
    assert!(h.finalized().is_empty());
    assert_eq!(
        h.core.poll_timeout(),
        Some(Deadline {
            at: h.start + 1001 * SEC,
            kind: DeadlineKind::Drain
        }),
        "only the drain deadline is left"
    );
    h.tick(1001 * SEC);
    assert_eq!(h.finalized(), vec![(s, EndReason::Shutdown)]);
}

#[test]
fn sweep_orphan_claims_exactly_at_the_grace_and_reports_what_it_did() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.attach(s);
    h.ev(Event::TransportDetached { session: s });
    h.at(60 * SEC - MS);
    assert_eq!(h.ev_h(Event::Sweep(Sweep::Orphan)), Handled::NoOp);
    assert_eq!(h.state(s), State::Registered);
    h.at(60 * SEC);
    assert_eq!(h.ev_h(Event::Sweep(Sweep::Orphan)), Handled::Applied);
    assert_eq!(h.finalized(), vec![(s, EndReason::OrphanReap)]);
    assert_eq!(h.ev_h(Event::Sweep(Sweep::Orphan)), Handled::NoOp);
}

#[test]
fn sweep_idle_claims_exactly_at_the_ttl_and_reports_what_it_did() {
    let mut h = Harness::with(Policy::default().idle_ttl(Some(30 * SEC)).lru_cap(None));
    let s = h.register(1, None);
    h.at(10 * SEC);
    let later = h.register(2, None);
    assert_eq!(
        h.core.poll_timeout(),
        Some(Deadline {
            at: h.start + 30 * SEC,
            kind: DeadlineKind::IdleReap
        })
    );
    h.at(30 * SEC - MS);
    assert_eq!(h.ev_h(Event::Sweep(Sweep::Idle)), Handled::NoOp);
    h.at(30 * SEC);
    assert_eq!(h.ev_h(Event::Sweep(Sweep::Idle)), Handled::Applied);
    assert_eq!(h.finalized(), vec![(s, EndReason::IdleReap)]);
    assert_eq!(h.state(later), State::Registered);
    assert_eq!(
        h.core.poll_timeout().map(|d| (d.at, d.kind)),
        Some((h.start + 40 * SEC, DeadlineKind::IdleReap))
    );
    h.tick(40 * SEC);
    assert_eq!(
        h.finalized(),
        vec![(s, EndReason::IdleReap), (later, EndReason::IdleReap)]
    );
}

#[test]
fn sweep_lru_reports_a_no_op_under_the_cap() {
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(2)));
    h.register(1, None);
    h.register(2, None);
    assert_eq!(h.ev_h(Event::Sweep(Sweep::Lru)), Handled::NoOp);
    assert!(h.finalized().is_empty());
    h.register(3, None);
    assert_eq!(h.finalized(), vec![(SessionId(1), EndReason::LruEvict)]);
}

#[test]
fn a_spurious_wake_drops_deadlines_nobody_waits_for() {
    let mut h = Harness::quiet();
    let a = h.register(1, None);
    let b = h.register(2, None);
    let mut works = Vec::new();
    for s in [a, b] {
        works.push(h.start_turn(s));
        h.ev(Event::CancelTurn { session: s });
    }
    assert_eq!(h.core.deadline_entries(), 2);
    assert_eq!(
        h.core.poll_timeout(),
        Some(Deadline {
            at: h.start + SEC,
            kind: DeadlineKind::Settle
        })
    );
    h.at(100 * MS);
    for work in works {
        h.ev(Event::WorkEnded {
            work,
            outcome: Outcome::Cancelled,
        });
    }
    h.tick(200 * MS);
    assert_eq!(h.core.deadline_entries(), 0);
    assert_eq!(h.core.poll_timeout(), None);
}

/// A session whose turn 1 was cancelled (settle deadline at 1 s) and ended,
/// with `then` done to it, and another session orphaned at 500 ms, whose
/// reap wakes the core while the stale deadline is on top of the table.
fn a_wake_over_a_stale_settle_deadline(then: impl FnOnce(&mut Harness, SessionId)) -> Harness {
    let mut h = Harness::with(
        Policy::default()
            .orphan_grace(500 * MS)
            .idle_ttl(None)
            .lru_cap(None),
    );
    let s = h.register(1, None);
    let other = h.register(2, None);
    h.attach(other);
    h.ev(Event::TransportDetached { session: other });
    then(&mut h, s);
    h.tick(500 * MS);
    assert_eq!(h.finalized(), vec![(other, EndReason::OrphanReap)]);
    h
}

#[test]
fn a_wake_drops_the_deadline_of_an_ended_turn_beside_the_next_turn() {
    let h = a_wake_over_a_stale_settle_deadline(|h, s| {
        let first = h.start_turn(s);
        h.ev(Event::CancelTurn { session: s });
        h.ev(Event::WorkEnded {
            work: first,
            outcome: Outcome::Cancelled,
        });
        h.start_turn(s);
    });
    assert_eq!(h.core.poll_timeout(), None, "turn 2 was never cancelled");
    assert_eq!(h.core.deadline_entries(), 0);
}

#[test]
fn a_wake_drops_the_deadline_of_an_ended_turn_beside_a_task_due_then_too() {
    let h = a_wake_over_a_stale_settle_deadline(|h, s| {
        let turn = h.start_turn(s);
        h.start_task(s);
        h.ev(Event::Cancel {
            session: s,
            mode: CancelMode::Graceful,
        });
        h.ev(Event::WorkEnded {
            work: turn,
            outcome: Outcome::Cancelled,
        });
    });
    assert_eq!(
        h.core.poll_timeout(),
        Some(Deadline {
            at: h.start + SEC,
            kind: DeadlineKind::Settle
        }),
        "the task's"
    );
    assert_eq!(h.core.deadline_entries(), 1, "only the task's is left");
}

#[test]
fn g9_shutdown_leaves_no_idle_deadline_to_wake_for() {
    let mut h = Harness::with(Policy::default().idle_ttl(Some(10 * SEC)).lru_cap(None));
    let idle = h.register(1, None);
    let busy = h.register(2, None);
    h.ev(Event::StartTurn { session: busy });
    assert_eq!(
        h.core.poll_timeout().map(|d| (d.at, d.kind)),
        Some((h.start + 10 * SEC, DeadlineKind::IdleReap))
    );
    h.ev(Event::BeginShutdown { drain: 60 * SEC });
    assert_eq!(h.finalized(), vec![(idle, EndReason::Shutdown)]);
    assert_eq!(
        h.core.poll_timeout().map(|d| (d.at, d.kind)),
        Some((h.start + 60 * SEC, DeadlineKind::Drain))
    );
}

// ----- streams -----------------------------------------------------------------

#[test]
fn g4_a_stream_the_work_reported_closed_is_not_closed_again() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    assert_eq!(
        h.ev_h(Event::StreamClosed {
            work: WorkId::turn(s, 1)
        }),
        Handled::NoOp,
        "no work, no stream"
    );
    h.attached_turn(s);
    assert_eq!(
        h.ev_h(Event::StreamClosed {
            work: WorkId::turn(s, 1)
        }),
        Handled::Applied
    );
    assert_eq!(
        h.ev_h(Event::StreamClosed {
            work: WorkId::turn(s, 1)
        }),
        Handled::NoOp
    );
    h.ev(Event::Cancel {
        session: s,
        mode: CancelMode::Immediate,
    });
    assert_eq!(h.cancels_of(s), 1);
    assert_eq!(h.closes_of(s), 0, "closed by the work already");
    h.tick(SEC);
    assert_eq!(h.detaches_of(s), 1);
    assert_eq!(h.closes_of(s), 0, "no close on detach either");
}

#[test]
fn g4_a_detach_closes_an_attached_stream_nobody_closed() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.attached_turn(s);
    h.ev(Event::Cancel {
        session: s,
        mode: CancelMode::Graceful,
    });
    assert_eq!(h.closes_of(s), 0, "a graceful cancel leaves the stream");
    h.tick(SEC);
    assert_eq!(h.closes_of(s), 1);
    assert_eq!(h.detaches_of(s), 1);
}

#[test]
fn g4_the_core_closes_a_stream_only_on_the_attach_race_and_at_a_detach() {
    let mut h = Harness::quiet();
    // Attached and open: its work closes it as the cancel ends its token; the
    // core orders it closed only when it detaches the work.
    let open = h.register(1, None);
    h.attached_turn(open);
    assert_eq!(
        h.ev_h(Event::CancelTurn { session: open }),
        Handled::Applied
    );
    assert_eq!(h.closes_of(open), 0);
    assert_eq!(h.ev_h(Event::CancelTurn { session: open }), Handled::NoOp);
    assert_eq!(h.cancels_of(open), 1);

    // Attached but already closed by the work: nothing to close.
    let closed = h.register(2, None);
    h.attached_turn(closed);
    h.ev(Event::StreamClosed {
        work: WorkId::turn(closed, 1),
    });
    h.ev(Event::CancelTurn { session: closed });
    assert_eq!(h.closes_of(closed), 0);

    // Not attached yet: closed when it attaches (seed 001), once.
    let late = h.register(3, None);
    h.ev(Event::StartTurn { session: late });
    h.ev(Event::CancelTurn { session: late });
    assert_eq!(h.closes_of(late), 0);
    h.ev(Event::StreamAttached {
        work: WorkId::turn(late, 1),
    });
    assert_eq!(h.closes_of(late), 1);

    h.tick(SEC);
    for s in [open, closed, late] {
        assert_eq!(h.detaches_of(s), 1);
        assert_eq!(h.state(s), State::Registered, "a turn cancel keeps it open");
    }
    assert_eq!(h.closes_of(open), 1);
    assert_eq!(h.closes_of(closed), 0);
    assert_eq!(h.closes_of(late), 1);

    let idle = h.register(4, None);
    assert_eq!(h.ev_h(Event::CancelTurn { session: idle }), Handled::NoOp);
}

// ----- cancel, holds, drain ----------------------------------------------------

#[test]
fn g1_cancel_descendants_reports_what_it_cancelled() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    assert_eq!(
        h.ev_h(Event::CancelDescendants { session: root }),
        Handled::NoOp,
        "no descendant to cancel"
    );
    assert_eq!(h.state(root), State::Registered);

    let a = h.register(2, Some(1));
    let b = h.register(3, Some(1));
    let done = h.register(4, Some(1));
    h.ev(Event::UserClose { session: done });
    h.ev(Event::StartTurn { session: b });
    assert_eq!(
        h.ev_h(Event::CancelDescendants { session: root }),
        Handled::Applied
    );
    assert_eq!(h.state(root), State::Registered, "G1: not the caller");
    assert_eq!(h.state(a), State::Finalized);
    assert_eq!(h.state(b), State::Cancelling);
    assert_eq!(
        h.ev_h(Event::CancelDescendants { session: root }),
        Handled::NoOp,
        "every descendant is cancelled already"
    );

    h.ev(Event::WorkExited {
        work: WorkId::turn(b, 1),
    });
    h.ev(Event::UserClose { session: root });
    assert_eq!(h.state(root), State::Finalized);
    assert_eq!(
        h.ev_h(Event::CancelDescendants { session: root }),
        Handled::AlreadyFinalized
    );
}

#[test]
fn g1_one_exit_finalizes_three_waiting_levels_children_first() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    let leaf = h.register(3, Some(2));
    h.ev(Event::StartTurn { session: leaf });
    h.ev(Event::AgentFinished { session: root });
    assert_eq!(h.state(root), State::Settled);
    assert_eq!(h.state(child), State::Cancelling);
    assert_eq!(h.state(leaf), State::Cancelling);
    assert!(h.finalized().is_empty());

    h.ev(Event::WorkExited {
        work: WorkId::turn(leaf, 1),
    });
    assert_eq!(
        h.finalized(),
        vec![
            (leaf, EndReason::ParentFinished),
            (child, EndReason::ParentFinished),
            (root, EndReason::Completed),
        ]
    );
}

#[test]
fn releasing_a_hold_never_held_is_a_no_op() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.ev(Event::Hold {
        session: s,
        hold: Hold::PendingInput,
    });
    assert_eq!(
        h.ev_h(Event::Release {
            session: s,
            hold: Hold::Delegation,
        }),
        Handled::NoOp
    );
    assert!(h.core.session(s).unwrap().is_held());
    assert_eq!(
        h.ev_h(Event::Release {
            session: s,
            hold: Hold::PendingInput,
        }),
        Handled::Applied
    );
    assert!(!h.core.session(s).unwrap().is_held());
}

#[test]
fn g3_idle_time_restarts_when_the_last_hold_is_released() {
    let mut h = Harness::with(Policy::default().idle_ttl(Some(30 * SEC)).lru_cap(None));
    let s = h.register(1, None);
    for hold in [Hold::PendingInput, Hold::Delegation] {
        h.ev(Event::Hold { session: s, hold });
    }
    h.at(10 * SEC);
    h.ev(Event::Release {
        session: s,
        hold: Hold::PendingInput,
    });
    assert_eq!(
        h.core.session(s).unwrap().idle_since(),
        h.start,
        "still held: idle time does not restart"
    );
    h.at(20 * SEC);
    h.ev(Event::Release {
        session: s,
        hold: Hold::Delegation,
    });
    assert_eq!(h.core.session(s).unwrap().idle_since(), h.start + 20 * SEC);
    h.tick(49 * SEC);
    assert!(h.finalized().is_empty(), "reaped before a full TTL idle");
    h.tick(50 * SEC);
    assert_eq!(h.finalized(), vec![(s, EndReason::IdleReap)]);
}

#[test]
fn g3_releasing_a_hold_mid_turn_does_not_restart_idle_time() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.ev(Event::Hold {
        session: s,
        hold: Hold::Delegation,
    });
    h.ev(Event::StartTurn { session: s });
    h.at(10 * SEC);
    h.ev(Event::Release {
        session: s,
        hold: Hold::Delegation,
    });
    assert_eq!(h.core.session(s).unwrap().idle_since(), h.start);
}

#[test]
fn g9_skip_drain_acts_only_during_an_undrained_shutdown() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.ev(Event::StartTurn { session: s });
    assert_eq!(h.ev_h(Event::SkipDrain), Handled::NoOp, "no shutdown yet");
    assert_eq!(h.state(s), State::Running);
    assert_eq!(
        h.ev_h(Event::BeginShutdown { drain: 60 * SEC }),
        Handled::Applied
    );
    assert_eq!(
        h.ev_h(Event::BeginShutdown { drain: 60 * SEC }),
        Handled::NoOp
    );
    assert!(!h.core.is_drained());
    assert_eq!(h.ev_h(Event::SkipDrain), Handled::Applied);
    assert!(h.core.is_drained());
    assert_eq!(h.state(s), State::Cancelling);
    assert_eq!(h.ev_h(Event::SkipDrain), Handled::NoOp, "drained already");
    assert_eq!(h.cancels_of(s), 1);
}

#[test]
fn g9_shutdown_flushes_once_then_finalizes_idle_sessions_children_first() {
    let mut h = Harness::quiet();
    h.register(1, None);
    h.register(2, Some(1));
    h.register(3, Some(2));
    h.register(4, Some(1));
    h.register(5, None);
    let effects = h.effects_of(Event::BeginShutdown { drain: 60 * SEC });
    let flush = effects
        .iter()
        .position(|e| *e == Effect::FlushTranscripts)
        .expect("transcripts flushed");
    assert_eq!(h.count(|e| *e == Effect::FlushTranscripts), 1, "once");
    let finalized: Vec<(usize, u64)> = effects
        .iter()
        .enumerate()
        .filter_map(|(i, e)| match e {
            Effect::Finalize(f) => Some((i, f.session.get())),
            _ => None,
        })
        .collect();
    assert!(
        finalized.iter().all(|(i, _)| *i > flush),
        "flushed before any finalize: {effects:?}"
    );
    let mut ids: Vec<u64> = finalized.iter().map(|(_, s)| *s).collect();
    let pos = |id: u64| ids.iter().position(|s| *s == id).unwrap();
    assert!(
        pos(3) < pos(2) && pos(2) < pos(1) && pos(4) < pos(1),
        "{ids:?}"
    );
    ids.sort_unstable();
    assert_eq!(ids, vec![1, 2, 3, 4, 5]);
    assert!(h
        .finalized()
        .iter()
        .all(|(_, reason)| *reason == EndReason::Shutdown));
    assert_eq!(
        effects.last(),
        Some(&Effect::ShutdownComplete(Box::default())),
        "nothing was running: nothing drained, cancelled or detached"
    );
    assert_eq!(h.core.open_sessions(), 0);
    assert!(h.finalize_of(SessionId(1)).is_some());
}

// ----- delegations and adoption under the cap (found by the property suite) --

/// An adopted held session wound down by an eviction (a registration at
/// the LRU cap evicts the least recently active idle session, which had
/// delegated to the adopted one's ancestor: the delegate is cancelled, the
/// finalize plan's last step, and its subtree wound down, the adopted
/// session with it, in the same input) has its holds, which it came with,
/// recorded dropped just before its finalize, as for any held session
/// finalized. (Found by the property suite with the eviction made by the
/// adoption itself, which evicts nothing since: G12.)
#[test]
fn an_adopted_held_session_wound_down_by_an_eviction_drops_its_holds_first() {
    let policy = Policy::default()
        .idle_ttl(None)
        .lru_cap(Some(7))
        .settle_timeout(Duration::ZERO);
    let mut h = Harness::with(policy);
    let s = SessionId;
    for (id, parent) in [(1, None), (2, None)] {
        h.register(id, parent);
    }
    h.ev(Event::Delegate {
        from: s(2),
        to: s(1),
    });
    for (id, parent) in [(3, Some(1)), (4, None), (5, Some(1))] {
        h.register(id, parent);
    }
    let adopt = |session, parent, holds| {
        Event::Adopt(Adoptee {
            session: s(session),
            parent: Some(s(parent)),
            turns: 0,
            last_outcome: None,
            holds,
            scope: Scope::SHARED,
        })
    };
    h.ev(adopt(6, 3, settle_core::Holds::default()));
    let held = settle_core::Holds {
        pending_input: 0,
        delegation: 1,
    };
    h.ev(adopt(7, 5, held));
    // At the cap: the next registration evicts the oldest idle session, 2.
    assert_eq!(
        h.try_ev(Event::Register {
            session: s(8),
            parent: None,
            scope: None,
        }),
        Ok(Handled::EvictsOnCommit)
    );
    let effects = h.effects_of(Event::Committed { session: s(8) });
    let dropped = effects.iter().position(|e| {
        matches!(e, Effect::RecordHolds { session, holds }
            if *session == s(7) && *holds == settle_core::Holds::default())
    });
    let finalized = effects.iter().position(
        |e| matches!(e, Effect::Transition(t) if t.session == s(7) && t.to == State::Finalized),
    );
    let (Some(dropped), Some(finalized)) = (dropped, finalized) else {
        panic!("the adopted session's holds dropped, then it finalized: {effects:?}");
    };
    assert!(dropped < finalized, "{effects:?}");
    assert_eq!(
        h.finalize_of(s(2)).map(|f| f.reason),
        Some(EndReason::LruEvict)
    );
    assert_eq!(h.state(s(1)), State::Finalized);
}

/// A cancel of a session's descendants that comes back to it through a
/// delegation cycle (a child delegated to a session that delegated to it)
/// cancels it for that delegation, after its descendants (G1), and says
/// why: not for the cancel of its descendants.
#[test]
fn cancel_descendants_that_comes_back_through_a_delegation_cycle_says_why() {
    let mut h = Harness::quiet();
    let s = SessionId;
    let caller = h.register(4, None);
    h.start_task(caller);
    let child = h.register(5, Some(4));
    let other = h.register(6, None);
    h.ev(Event::Delegate {
        from: other,
        to: caller,
    });
    h.ev(Event::Delegate {
        from: child,
        to: other,
    });
    let effects = h.effects_of(Event::CancelDescendants { session: caller });
    let moved = |id: SessionId| {
        effects.iter().position(|e| {
            matches!(e, Effect::Transition(t)
                if t.session == id && matches!(t.to, State::Cancelling | State::Settled))
        })
    };
    let caller_moved = moved(caller).expect("the caller is cancelled by the cycle");
    let Effect::Transition(t) = &effects[caller_moved] else {
        unreachable!()
    };
    assert_eq!(t.cause, Cause::DelegationInterrupted, "{effects:?}");
    let child_finalized = effects.iter().position(
        |e| matches!(e, Effect::Transition(t) if t.session == child && t.to == State::Finalized),
    );
    assert!(
        child_finalized.is_some_and(|c| c < caller_moved),
        "its descendant ended first (G1): {effects:?}"
    );
    assert_eq!(h.state(s(5)), State::Finalized);
}
