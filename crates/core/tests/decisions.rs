//! The lifecycle facts the core owns since the runtime stopped deciding
//! them: the answer for a forgotten session, starts answered with their
//! work, a turn still settling, slots, delegations, a dropped guard during a
//! shutdown, the loss of the lease, and which transitions the timeline keeps.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use settle_core::{
    CancelMode, Cause, Effect, EndReason, Error, Event, Handled, Hold, Outcome, Policy, Scope,
    SessionId, State, WorkId,
};
use support::{Harness, MS, SEC};

fn finalize_and_forget(h: &mut Harness, id: SessionId) {
    h.ev(Event::UserClose { session: id });
    assert_eq!(h.state(id), State::Finalized);
    assert!(h.core.forget(id));
}

#[test]
fn g10_a_forgotten_session_answers_as_finalized_to_every_input() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    finalize_and_forget(&mut h, child);
    assert_eq!(h.core.state(child), Some(State::Finalized));
    let turn = WorkId::turn(child, 1);
    let ends = [
        Event::AgentFinished { session: child },
        Event::Abandoned { session: child },
        Event::Cancel {
            session: child,
            mode: CancelMode::Immediate,
        },
        Event::CancelTurn { session: child },
        Event::CancelWork { work: turn },
        Event::CancelDescendants { session: child },
        Event::UserClose { session: child },
        Event::Release {
            session: child,
            hold: Hold::PendingInput,
        },
        Event::TransportDetached { session: child },
        Event::Withdraw { session: child },
    ];
    for event in ends {
        assert_eq!(
            h.try_ev(event.clone()),
            Ok(Handled::AlreadyFinalized),
            "{event:?}"
        );
    }
    let uses = [
        Event::StartTurn { session: child },
        Event::StartTask { session: child },
        Event::Hold {
            session: child,
            hold: Hold::Delegation,
        },
        Event::TransportAttached {
            session: child,
            close_on_disconnect: false,
        },
        Event::Register {
            session: SessionId(3),
            parent: Some(child),
            scope: None,
        },
        Event::Delegate {
            from: child,
            to: root,
        },
        Event::Delegate {
            from: root,
            to: child,
        },
    ];
    for event in uses {
        assert_eq!(
            h.try_ev(event.clone()),
            Err(Error::SessionClosed(child)),
            "{event:?}"
        );
    }
    for event in [
        Event::StreamAttached { work: turn },
        Event::StreamClosed { work: turn },
        Event::WorkExited { work: turn },
    ] {
        assert_eq!(h.try_ev(event.clone()), Ok(Handled::NoOp), "{event:?}");
    }
    assert!(h.drain().is_empty(), "nothing was ordered");
    // A never-registered id is the only "not known".
    assert_eq!(
        h.try_ev(Event::StartTurn {
            session: SessionId(77)
        }),
        Err(Error::UnknownSession(SessionId(77)))
    );
}

#[test]
fn g10_a_start_answers_its_work_and_no_effect_starts_it() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let started = h.try_ev(Event::StartTurn { session: s });
    assert_eq!(started, Ok(Handled::Started(WorkId::turn(s, 1))));
    let task = h.try_ev(Event::StartTask { session: s });
    assert_eq!(task, Ok(Handled::Started(WorkId::task(s, 1))));
    let transitions: Vec<_> = h
        .log
        .iter()
        .filter(|e| matches!(e, Effect::Transition(_)))
        .collect();
    assert_eq!(
        transitions.len(),
        2,
        "registered, then running: {:?}",
        h.log
    );
}

#[test]
fn g5_a_turn_started_while_the_cancelled_one_settles_is_told_so() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let turn = h.start_turn(s);
    // A dropped `Turn` cancels its work; the next start comes at once.
    h.ev(Event::CancelWork { work: turn });
    assert_eq!(
        h.try_ev(Event::StartTurn { session: s }),
        Err(Error::TurnSettling {
            session: s,
            turn: 1
        })
    );
    // A turn that was not cancelled is simply in flight.
    h.ev(Event::WorkExited { work: turn });
    let next = h.start_turn(s);
    assert!(matches!(
        h.try_ev(Event::StartTurn { session: s }),
        Err(Error::WrongState { .. })
    ));
    // Once the cancelled turn settled, the next one starts.
    h.ev(Event::CancelWork { work: next });
    h.advance(2 * SEC);
    assert_eq!(h.start_turn(s), WorkId::turn(s, 3));
}

/// A turn whose start was refused to its caller (the store did not take
/// it) is ending: the next start is told to wait for it, as after a cancel,
/// and not refused as if the turn still ran; nothing is cancelled (G6), and
/// the turn ends as its work says.
#[test]
fn g5_a_turn_started_while_the_one_whose_start_was_refused_ends_is_told_so() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let turn = h.start_turn(s);
    let before = h.log.len();
    assert_eq!(
        h.try_ev(Event::StartRefused { work: turn }),
        Ok(Handled::Applied)
    );
    assert_eq!(h.log.len(), before, "no effect: {:?}", &h.log[before..]);
    assert_eq!(
        h.try_ev(Event::StartTurn { session: s }),
        Err(Error::TurnSettling {
            session: s,
            turn: 1
        })
    );
    // Said twice, or of a work that ended: nothing more.
    assert_eq!(
        h.try_ev(Event::StartRefused { work: turn }),
        Ok(Handled::NoOp)
    );
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Failed,
    });
    assert_eq!(
        h.try_ev(Event::StartRefused { work: turn }),
        Ok(Handled::NoOp)
    );
    assert_eq!(h.start_turn(s), WorkId::turn(s, 2));
}

#[test]
fn a_turn_over_the_slots_is_refused_and_a_finalize_frees_its_slot() {
    let policy = Policy::default()
        .idle_ttl(None)
        .lru_cap(None)
        .slots(Some(1));
    let mut h = Harness::with(policy);
    let a = h.register(1, None);
    let b = h.register(2, None);
    let turn = h.start_turn(a);
    assert_eq!(
        h.try_ev(Event::StartTurn { session: b }),
        Err(Error::NoSlot { slots: 1 })
    );
    // A task needs no slot, and the slot stays with `a` between its turns.
    h.start_task(b);
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Completed,
    });
    assert_eq!(h.start_turn(a), WorkId::turn(a, 2));
    h.ev(Event::UserClose { session: a });
    h.advance(2 * SEC);
    assert_eq!(h.state(a), State::Finalized);
    assert_eq!(h.start_turn(b), WorkId::turn(b, 1));
}

#[test]
fn a_finalized_delegator_interrupts_what_it_delegated_to() {
    let mut h = Harness::quiet();
    let boss = h.register(1, None);
    let worker = h.register(2, None);
    let work = h.start_turn(worker);
    assert_eq!(
        h.ev_h(Event::Delegate {
            from: boss,
            to: worker
        }),
        Handled::Applied
    );
    assert_eq!(
        h.ev_h(Event::Delegate {
            from: boss,
            to: worker
        }),
        Handled::NoOp
    );
    let effects = h.effects_of(Event::UserClose { session: boss });
    let finalize = effects
        .iter()
        .position(|e| matches!(e, Effect::Finalize(f) if f.session == boss))
        .expect("the delegator is finalized");
    let cancel = effects
        .iter()
        .position(|e| matches!(e, Effect::CancelWork { work: w, .. } if *w == work))
        .expect("the delegate's work is cancelled");
    assert!(
        finalize < cancel,
        "interrupted after the finalize: {effects:?}"
    );
    assert!(effects.iter().any(|e| matches!(
        e,
        Effect::Transition(t) if t.session == worker && t.cause == Cause::DelegationInterrupted
    )));
    h.ev(Event::WorkExited { work });
    assert_eq!(h.state(worker), State::Finalized);
}

#[test]
fn g1_a_delegation_to_an_ancestor_is_not_interrupted_by_the_descendants_wind_down() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    h.ev(Event::Delegate {
        from: child,
        to: root,
    });
    assert_eq!(
        h.ev_h(Event::CancelDescendants { session: root }),
        Handled::Applied
    );
    assert_eq!(h.state(child), State::Finalized);
    assert_eq!(h.state(root), State::Registered, "the caller is spared");
}

#[test]
fn g9_an_agent_abandoned_during_the_drain_leaves_its_subtree_draining() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    let turn = h.start_turn(child);
    h.ev(Event::BeginShutdown { drain: 2 * SEC });
    h.advance(300 * MS);
    // The agent's code returned on "shutdown begun" and dropped its guard.
    assert_eq!(h.ev_h(Event::Abandoned { session: root }), Handled::NoOp);
    assert_eq!(h.cancels_of(child), 0, "the child's turn keeps the drain");
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Completed,
    });
    assert_eq!(
        h.finalized(),
        vec![(child, EndReason::Shutdown), (root, EndReason::Shutdown)]
    );
    let summary = h.log.iter().find_map(|e| match e {
        Effect::ShutdownComplete(s) => Some(s.clone()),
        _ => None,
    });
    assert_eq!(summary.expect("complete").drained, vec![child]);
}

#[test]
fn an_abandoned_agent_outside_a_shutdown_is_cancelled_subtree_first() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    h.start_turn(child);
    assert_eq!(h.ev_h(Event::Abandoned { session: root }), Handled::Applied);
    assert_eq!(h.cancels_of(child), 1);
    assert_eq!(h.state(root), State::Cancelling);
}

#[test]
fn g8_a_lost_lease_cancels_everything_now_and_says_so() {
    let mut h = Harness::quiet();
    let idle = h.register(1, None);
    let busy = h.register(2, None);
    let turn = h.start_turn(busy);
    assert_eq!(h.ev_h(Event::LeaseLost), Handled::Applied);
    assert_eq!(h.state(idle), State::Finalized);
    // What its clients are told is what the store will hold: recovery ends
    // the sessions of a lost lease, not this process (G8).
    let reasons: Vec<EndReason> = h
        .log
        .iter()
        .filter_map(|e| match e {
            Effect::Finalize(f) => Some(f.reason),
            _ => None,
        })
        .collect();
    assert_eq!(reasons, [EndReason::Recovered]);
    assert_eq!(h.cancels_of(busy), 1);
    assert_eq!(
        h.try_ev(Event::Register {
            session: SessionId(3),
            parent: None,
            scope: None,
        }),
        Err(Error::ShuttingDown)
    );
    h.ev(Event::WorkExited { work: turn });
    let summary = h.log.iter().find_map(|e| match e {
        Effect::ShutdownComplete(s) => Some(s.clone()),
        _ => None,
    });
    assert!(summary.expect("complete").lease_lost);
    let last = h.log.iter().rev().find_map(|e| match e {
        Effect::Finalize(f) => Some((f.session, f.reason)),
        _ => None,
    });
    assert_eq!(last, Some((busy, EndReason::Recovered)));
}

#[test]
fn the_timeline_keeps_every_transition_but_the_registration_and_the_finalize() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let turn = h.start_turn(s);
    h.ev(Event::WorkExited { work: turn });
    h.ev(Event::UserClose { session: s });
    let steps: Vec<(Option<State>, State, bool)> = h
        .log
        .iter()
        .filter_map(|e| match e {
            Effect::Transition(t) => Some((t.from, t.to, t.timeline())),
            _ => None,
        })
        .collect();
    assert_eq!(
        steps,
        vec![
            (None, State::Registered, false),
            (Some(State::Registered), State::Running, true),
            (Some(State::Running), State::Registered, true),
            (Some(State::Registered), State::Settled, true),
            (Some(State::Settled), State::Finalized, false),
        ]
    );
}

#[test]
fn g10_an_id_the_store_reports_finalized_gets_a_finalized_sessions_answers() {
    let mut h = Harness::quiet();
    let open = h.register(1, None);
    let gone = h.register(2, None);
    finalize_and_forget(&mut h, gone);
    let earlier = SessionId(40);
    assert_eq!(h.core.state(earlier), None);
    assert!(h.core.remember_finalized(earlier), "new to the core");
    assert!(!h.core.remember_finalized(earlier), "remembered once");
    assert!(!h.core.remember_finalized(gone), "already forgotten");
    assert!(
        !h.core.remember_finalized(open),
        "a kept session is left alone"
    );
    assert_eq!(h.state(open), State::Registered);
    assert_eq!(h.core.state(earlier), Some(State::Finalized));
    assert_eq!(
        h.try_ev(Event::UserClose { session: earlier }),
        Ok(Handled::AlreadyFinalized)
    );
    assert_eq!(
        h.try_ev(Event::StartTurn { session: earlier }),
        Err(Error::SessionClosed(earlier))
    );
}

#[test]
fn forgetting_children_one_by_one_keeps_the_parents_list_bounded() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let children: Vec<SessionId> = (2..102).map(|id| h.register(id, Some(1))).collect();
    for (i, child) in children.iter().enumerate() {
        finalize_and_forget(&mut h, *child);
        let live = children.len() - i - 1;
        let entries = h.core.child_entries(root);
        assert!(
            entries <= 2 * live + 2,
            "{entries} entries for {live} live children after {} forgets",
            i + 1
        );
    }
    assert_eq!(h.core.child_entries(root), 0);
}

#[test]
fn g3_a_parent_whose_only_child_is_withdrawn_is_reclaimable_again() {
    let policy = Policy::default().idle_ttl(Some(SEC)).lru_cap(None);
    let mut h = Harness::with(policy);
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    assert_eq!(h.ev_h(Event::Withdraw { session: child }), Handled::Applied);
    h.advance(2 * SEC);
    assert_eq!(h.finalized(), vec![(root, EndReason::IdleReap)]);
}

#[test]
fn g1_a_close_that_waited_for_a_child_goes_when_that_child_is_withdrawn() {
    let mut h = Harness::new();
    let root = h.register(1, None);
    let s = h.register(2, Some(1));
    h.ev(Event::TransportAttached {
        session: s,
        close_on_disconnect: true,
    });
    let child = h.register(3, Some(2));
    // The transport is gone, but a child is open: the close waits for it.
    h.ev(Event::TransportDetached { session: s });
    assert_eq!(h.state(s), State::Registered);
    assert_eq!(h.ev_h(Event::Withdraw { session: child }), Handled::Applied);
    assert_eq!(h.finalized(), vec![(s, EndReason::TransportClosed)]);
    assert_eq!(h.state(root), State::Registered);
}

#[test]
fn the_answer_predicates_say_what_they_name() {
    let work = WorkId::turn(SessionId(1), 1);
    assert_eq!(Handled::Started(work).started(), Some(work));
    assert_eq!(Handled::Applied.started(), None);
    assert!(Error::SessionClosed(SessionId(1)).is_session_closed());
    assert!(!Error::ShuttingDown.is_session_closed());
    assert!(Error::ShuttingDown.is_shutting_down());
    assert!(!Error::SessionClosed(SessionId(1)).is_shutting_down());
    let closing = Error::Closing {
        session: SessionId(1),
        reason: EndReason::Completed,
    };
    assert!(closing.is_closing());
    assert!(!Error::ShuttingDown.is_closing());
    let exhausted = Error::BudgetExhausted {
        session: SessionId(1),
        limit: settle_core::BudgetLimit::Turns,
    };
    assert!(exhausted.is_budget_exhausted());
    assert!(!closing.is_budget_exhausted());
}

#[test]
fn g3_a_register_over_a_cap_with_nothing_to_evict_is_refused_and_a_new_session_is_never_evicted() {
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(2)));
    let a = h.register(1, None);
    let b = h.register(2, None);
    for s in [a, b] {
        h.ev(Event::Hold {
            session: s,
            hold: Hold::PendingInput,
        });
    }
    h.drain();
    // Full of held sessions: refused, and nothing changed.
    for id in [3, 4] {
        assert_eq!(
            h.try_ev(Event::Register {
                session: SessionId(id),
                parent: None,
                scope: None,
            }),
            Err(Error::OverCapacity { cap: 2 })
        );
        assert!(h.drain().is_empty());
        assert_eq!(h.core.state(SessionId(id)), None);
    }
    assert_eq!(h.core.open_sessions(), 2);
    assert!(h.finalized().is_empty());

    // A child under the only idle session would make it unreclaimable: its
    // parent is not evicted for it.
    h.ev(Event::Release {
        session: a,
        hold: Hold::PendingInput,
    });
    assert_eq!(
        h.try_ev(Event::Register {
            session: SessionId(5),
            parent: Some(a),
            scope: None,
        }),
        Err(Error::OverCapacity { cap: 2 })
    );
    assert_eq!(h.state(a), State::Registered);

    // One released session makes room: it is evicted, the new one lives.
    let c = h.register(6, None);
    assert_eq!(h.finalized(), vec![(a, EndReason::LruEvict)]);
    assert_eq!(h.state(c), State::Registered);
    assert_eq!(h.core.open_sessions(), 2);
}

/// Found from outside: with `settle serve --max-sessions` and tokens, one
/// principal's creates evicted another principal's idle sessions. A
/// registration at the cap evicts only sessions of its own scope; with none
/// of its own to evict it is refused, whoever else is idle.
#[test]
fn g3_an_eviction_at_the_cap_takes_only_sessions_of_the_registering_scope() {
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(3)));
    let (a, b) = (Scope(1), Scope(2));
    // At the cap, committed at once, as the runtime does once its row is
    // written.
    let register = |h: &mut Harness, id: u64, scope: Scope| {
        let session = SessionId(id);
        let handled = h.try_ev(Event::Register {
            session,
            parent: None,
            scope: Some(scope),
        });
        if handled == Ok(Handled::EvictsOnCommit) {
            h.ev(Event::Committed { session });
        }
        handled
    };
    // A's two idle sessions are the oldest; B's one is the newest.
    for (id, scope) in [(1, a), (2, a), (3, b)] {
        assert_eq!(register(&mut h, id, scope), Ok(Handled::Applied));
        h.advance(SEC);
    }
    // B at the cap: its own idle session goes, though A's are older.
    assert_eq!(register(&mut h, 4, b), Ok(Handled::EvictsOnCommit));
    assert_eq!(h.finalized(), vec![(SessionId(3), EndReason::LruEvict)]);
    assert_eq!(h.core.session(SessionId(4)).map(|s| s.scope()), Some(b));
    // B again: its only session is the one it is making room beside, busy.
    h.start_turn(SessionId(4));
    let before = h.log.len();
    assert_eq!(register(&mut h, 5, b), Err(Error::OverCapacity { cap: 3 }));
    assert_eq!(h.log.len(), before, "nothing of A's was evicted for B");
    assert_eq!(h.state(SessionId(1)), State::Registered);
    assert_eq!(h.state(SessionId(2)), State::Registered);
    // A evicts its own oldest.
    assert_eq!(register(&mut h, 6, a), Ok(Handled::EvictsOnCommit));
    let evicted = |ids: &[u64]| -> Vec<_> {
        ids.iter()
            .map(|&id| (SessionId(id), EndReason::LruEvict))
            .collect()
    };
    assert_eq!(h.finalized(), evicted(&[3, 1]));
    // A child named no scope is in its parent's: room is made among A's.
    assert_eq!(
        h.try_ev(Event::Register {
            session: SessionId(7),
            parent: Some(SessionId(6)),
            scope: None,
        }),
        Ok(Handled::EvictsOnCommit)
    );
    h.ev(Event::Committed {
        session: SessionId(7),
    });
    assert_eq!(h.finalized(), evicted(&[3, 1, 2]));
    assert_eq!(h.core.session(SessionId(7)).map(|s| s.scope()), Some(a));
    // A child named a scope is in that one, whatever its parent's: B has
    // nothing idle, so it is refused though A's child is.
    assert_eq!(
        h.try_ev(Event::Register {
            session: SessionId(8),
            parent: Some(SessionId(6)),
            scope: Some(b),
        }),
        Err(Error::OverCapacity { cap: 3 })
    );
    // A root named none is in the shared scope, which has nothing idle.
    assert_eq!(
        h.try_ev(Event::Register {
            session: SessionId(9),
            parent: None,
            scope: None,
        }),
        Err(Error::OverCapacity { cap: 3 })
    );
    assert_eq!(h.finalized(), evicted(&[3, 1, 2]));
}

/// Found from outside: a registration at the cap evicted an idle session
/// (finalized `lru_evict`, its memory committed) and then the store
/// refused the registration's row, so the session was ended for one that
/// never existed. The room is made once the registration is committed; a
/// withdrawn one evicts no one.
#[test]
fn g3_a_registration_the_store_refused_at_the_cap_evicts_no_one() {
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(2)));
    let (a, b) = (h.register(1, None), h.register(2, None));
    h.drain();
    let register = |h: &mut Harness, id: u64| {
        h.try_ev(Event::Register {
            session: SessionId(id),
            parent: None,
            scope: None,
        })
    };
    assert_eq!(register(&mut h, 3), Ok(Handled::EvictsOnCommit));
    assert!(h.finalized().is_empty(), "evicted before the commit");
    // The store refused its row: withdrawn, and both idle sessions live.
    h.ev(Event::Withdraw {
        session: SessionId(3),
    });
    assert_eq!(h.state(a), State::Registered);
    assert_eq!(h.state(b), State::Registered);
    assert_eq!(h.core.open_sessions(), 2);
    assert!(h.finalized().is_empty());

    // A burst at the cap is admitted: its sessions evict each other as
    // they commit, least recently active first.
    for id in [4, 5, 6] {
        assert_eq!(register(&mut h, id), Ok(Handled::EvictsOnCommit));
    }
    assert!(h.finalized().is_empty());
    // 4's commit makes room for 4 only: the oldest idle one goes, not
    // both (5 and 6 may still be refused).
    h.ev(Event::Committed {
        session: SessionId(4),
    });
    assert_eq!(h.finalized(), vec![(a, EndReason::LruEvict)]);
    // The other starts a turn, and the store refuses 5.
    let turn = h.start_turn(b);
    h.ev(Event::Withdraw {
        session: SessionId(5),
    });
    // 6's commit takes the least recently active committed idle one: 4,
    // not the busy one.
    h.ev(Event::Committed {
        session: SessionId(6),
    });
    assert_eq!(
        h.finalized(),
        vec![
            (a, EndReason::LruEvict),
            (SessionId(4), EndReason::LruEvict)
        ]
    );
    assert_eq!(h.core.open_sessions(), 2);
    assert_eq!(h.state(SessionId(6)), State::Registered);
    // A second commit, and one of a finalized session, change nothing.
    for id in [4, 6] {
        assert_eq!(
            h.try_ev(Event::Committed {
                session: SessionId(id),
            }),
            Ok(Handled::NoOp)
        );
    }
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Completed,
    });
    assert_eq!(h.state(b), State::Registered);
}

/// Found by the property suite: a registration at the cap evicted the new
/// session's last sibling before the new session existed, and the parent,
/// whose close-on-disconnect reclaim waited only for that child, was
/// finalized under its new child (G1). Room is found first and made once the
/// new session is its parent's child.
#[test]
fn g1_an_eviction_at_registration_never_finalizes_the_new_sessions_parent() {
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(3)));
    let idle = h.register(1, None);
    let parent = h.register(6, None);
    h.ev(Event::TransportAttached {
        session: parent,
        close_on_disconnect: true,
    });
    let busy = h.register(7, None);
    h.start_turn(busy);
    let sibling = h.register(9, Some(6));
    // The transport goes: the parent's reclaim waits for its child.
    h.ev(Event::TransportDetached { session: parent });
    assert_eq!(h.state(parent), State::Registered);
    let child = h.register(10, Some(6));
    assert_eq!(h.state(idle), State::Finalized);
    assert_eq!(h.state(sibling), State::Finalized);
    assert_eq!(h.state(child), State::Registered);
    assert_ne!(
        h.state(parent),
        State::Finalized,
        "G1: the parent was finalized under its new child"
    );
}

/// A registration of an id the core keeps says the id is taken, whatever
/// else would refuse it: a shutdown, a parent that is not live, a full cap.
#[test]
fn a_kept_id_is_refused_as_taken_before_anything_else_is_asked() {
    let taken = |h: &mut Harness, id: u64, parent: Option<u64>| {
        let refused = h.try_ev(Event::Register {
            session: SessionId(id),
            parent: parent.map(SessionId),
            scope: None,
        });
        assert_eq!(refused, Err(Error::DuplicateSession(SessionId(id))));
        assert!(h.drain().is_empty(), "nothing changed");
    };
    // Over a cap nothing can be evicted from.
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(1)));
    let a = h.register(1, None);
    h.ev(Event::Hold {
        session: a,
        hold: Hold::PendingInput,
    });
    taken(&mut h, 1, None);
    // Under a parent that is finalized.
    let mut h = Harness::quiet();
    let parent = h.register(1, None);
    h.register(2, None);
    h.ev(Event::UserClose { session: parent });
    assert_eq!(h.state(parent), State::Finalized);
    taken(&mut h, 2, Some(1));
    // During a shutdown.
    let mut h = Harness::quiet();
    let busy = h.register(1, None);
    h.start_turn(busy);
    h.ev(Event::BeginShutdown { drain: 60 * SEC });
    taken(&mut h, 1, None);
    assert_eq!(h.state(busy), State::Running);
}

/// Only a registration nothing happened to may be withdrawn: one that ran
/// a turn or a task (idle again), that has a child, or that is closing is
/// refused, and stays.
#[test]
fn only_an_unused_registration_can_be_withdrawn() {
    let refused = |h: &mut Harness, s: SessionId| {
        let answer = h.try_ev(Event::Withdraw { session: s });
        assert!(
            matches!(answer, Err(Error::WrongState { session, .. }) if session == s),
            "{answer:?}"
        );
        assert!(h.core.session(s).is_some(), "{s} is kept");
    };
    let mut h = Harness::quiet();
    let ran_turn = h.register(1, None);
    let work = h.start_turn(ran_turn);
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Completed,
    });
    assert_eq!(h.state(ran_turn), State::Registered);
    refused(&mut h, ran_turn);
    let ran_task = h.register(2, None);
    let work = h.start_task(ran_task);
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Completed,
    });
    assert_eq!(h.state(ran_task), State::Registered);
    refused(&mut h, ran_task);
    let parent = h.register(3, None);
    h.register(4, Some(3));
    refused(&mut h, parent);
    // Closing: a held session waits for the end of the drain.
    let held = h.register(5, None);
    h.ev(Event::Hold {
        session: held,
        hold: Hold::PendingInput,
    });
    h.ev(Event::BeginShutdown { drain: 60 * SEC });
    assert_eq!(h.state(held), State::Registered);
    refused(&mut h, held);
}

/// A withdrawn child leaves its parent's list, and only it: its siblings
/// are still the parent's, and wound down with it.
#[test]
fn a_withdrawn_child_leaves_its_siblings_under_their_parent() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let gone = h.register(2, Some(1));
    let stays = h.register(3, Some(1));
    assert_eq!(h.ev_h(Event::Withdraw { session: gone }), Handled::Applied);
    let children: Vec<_> = h.core.session(root).unwrap().children().collect();
    assert_eq!(children, [stays]);
    assert_eq!(h.core.child_entries(root), 1);
    h.ev(Event::UserClose { session: root });
    assert_eq!(h.state(stays), State::Finalized);
    assert_eq!(h.state(root), State::Finalized);
}
