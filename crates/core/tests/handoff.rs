//! Handing sessions off and adopting them (SPEC §12, G12), decided by the
//! core: a handoff releases idle sessions instead of finalizing them, a
//! turn that cannot finish within the drain is cancelled and settled first,
//! and an adopted session goes on with its turn count.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use settle_core::{
    Adoptee, Effect, EndReason, Error, Event, HandOff, Handled, Hold, Holds, Outcome, Policy,
    Scope, SessionId, State, Sweep, WorkId,
};
use support::{Harness, MS, SEC};

fn handed_off(h: &Harness) -> Vec<HandOff> {
    h.log
        .iter()
        .filter_map(|e| match e {
            Effect::HandOff(h) => Some(*h),
            _ => None,
        })
        .collect()
}

fn summary(h: &Harness) -> settle_core::ShutdownSummary {
    h.log
        .iter()
        .find_map(|e| match e {
            Effect::ShutdownComplete(s) => Some((**s).clone()),
            _ => None,
        })
        .expect("the shutdown completed")
}

#[test]
fn g12_a_handoff_releases_idle_sessions_and_drains_running_turns_first() {
    let mut h = Harness::quiet();
    let idle = h.register(1, None);
    let busy = h.register(2, None);
    let first = h.start_turn(idle);
    h.ev(Event::WorkEnded {
        work: first,
        outcome: Outcome::Completed,
    });
    let turn = h.start_turn(busy);
    h.ev(Event::BeginHandoff { drain: 5 * SEC });
    // The idle session goes at once, released, not finalized.
    assert_eq!(
        handed_off(&h),
        vec![HandOff {
            session: idle,
            turns: 1,
            last_outcome: Some(Outcome::Completed),
            holds: Holds::default(),
        }]
    );
    assert!(h.finalized().is_empty());
    assert_eq!(h.core.state(idle), None);
    assert!(h.core.is_handed_off(idle));
    // The running turn keeps the drain, then its session is released.
    assert_eq!(h.state(busy), State::Running);
    assert!(!h.core.is_handed_off(busy), "kept until its turn ends");
    assert!(!h.core.is_handed_off(SessionId(99)), "never known here");
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Completed,
    });
    assert_eq!(handed_off(&h).len(), 2);
    assert!(
        h.finalized().is_empty(),
        "nothing finalized: {:?}",
        h.finalized()
    );
    let s = summary(&h);
    assert!(s.handoff);
    assert_eq!(s.released, vec![idle, busy]);
    assert_eq!(s.drained, vec![busy]);
}

#[test]
fn g12_a_turn_that_cannot_finish_in_the_drain_is_cancelled_settled_then_released() {
    let mut h = Harness::with(
        Policy::default()
            .idle_ttl(None)
            .lru_cap(None)
            .settle_timeout(SEC),
    );
    let s = h.register(1, None);
    let turn = h.attached_turn(s);
    h.ev(Event::BeginHandoff { drain: 100 * MS });
    h.tick(100 * MS);
    // Cancelled at the end of the drain; the session stays open meanwhile.
    assert_eq!(h.cancels_of(s), 1);
    assert_eq!(h.state(s), State::Running);
    assert!(handed_off(&h).is_empty());
    h.ev(Event::WorkExited { work: turn });
    assert_eq!(h.ended(turn), vec![Outcome::Cancelled]);
    assert_eq!(
        handed_off(&h),
        vec![HandOff {
            session: s,
            turns: 1,
            last_outcome: Some(Outcome::Cancelled),
            holds: Holds::default(),
        }]
    );
    assert!(h.finalized().is_empty());
    assert_eq!(summary(&h).cancelled, vec![s]);
}

#[test]
fn g12_children_are_released_before_their_parents() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    let turn = h.start_turn(child);
    h.ev(Event::BeginHandoff { drain: 5 * SEC });
    // The parent is idle but waits for its running child.
    assert!(handed_off(&h).is_empty());
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Completed,
    });
    let order: Vec<SessionId> = handed_off(&h).iter().map(|h| h.session).collect();
    assert_eq!(order, vec![child, root]);
}

#[test]
fn g12_a_session_closing_for_its_own_reason_is_finalized_not_released() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let turn = h.start_turn(s);
    h.ev(Event::BeginHandoff { drain: 5 * SEC });
    h.ev(Event::UserClose { session: s });
    h.ev(Event::WorkExited { work: turn });
    assert!(handed_off(&h).is_empty());
    assert_eq!(h.finalized(), vec![(s, EndReason::Shutdown)]);
}

#[test]
fn g8_once_the_lease_is_lost_a_handoff_releases_nothing_more() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    let turn = h.start_turn(s);
    h.ev(Event::BeginHandoff { drain: 5 * SEC });
    h.ev(Event::LeaseLost);
    h.ev(Event::WorkExited { work: turn });
    assert!(handed_off(&h).is_empty());
    assert_eq!(h.finalized(), vec![(s, EndReason::Recovered)]);
}

#[test]
fn g12_a_handed_off_session_is_another_processs_to_use() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    h.ev(Event::BeginHandoff { drain: SEC });
    assert_eq!(
        h.try_ev(Event::StartTurn { session: s }),
        Err(Error::HandedOff(s))
    );
    assert_eq!(
        h.try_ev(Event::UserClose { session: s }),
        Err(Error::HandedOff(s))
    );
    assert_eq!(
        h.try_ev(Event::TransportAttached {
            session: s,
            close_on_disconnect: false
        }),
        Err(Error::HandedOff(s))
    );
    let late = WorkId::turn(s, 1);
    assert_eq!(
        h.try_ev(Event::WorkExited { work: late }),
        Ok(Handled::NoOp)
    );
    assert!(!h.core.forget(s));
}

#[test]
fn g12_an_adopted_session_goes_on_with_its_turns_and_is_reclaimed_like_any() {
    let mut h = Harness::with(Policy::default().idle_ttl(Some(10 * SEC)).lru_cap(None));
    let s = SessionId(7);
    h.ev(Event::Adopt(Adoptee {
        session: s,
        parent: Some(SessionId(3)),
        turns: 2,
        last_outcome: Some(Outcome::Completed),
        holds: Holds::default(),
        scope: Scope::SHARED,
    }));
    assert_eq!(h.state(s), State::Registered);
    // Its parent lives elsewhere: a root here.
    assert_eq!(h.core.session(s).unwrap().parent(), None);
    let turn = h.start_turn(s);
    assert_eq!(turn, WorkId::turn(s, 3));
    h.ev(Event::WorkEnded {
        work: turn,
        outcome: Outcome::Completed,
    });
    // Adopting it twice is refused; so is adopting during a shutdown.
    assert_eq!(
        h.try_ev(Event::Adopt(Adoptee {
            session: s,
            parent: None,
            turns: 2,
            last_outcome: None,
            holds: Holds::default(),
            scope: Scope::SHARED,
        })),
        Err(Error::DuplicateSession(s))
    );
    h.advance(10 * SEC);
    assert_eq!(h.finalized(), vec![(s, EndReason::IdleReap)]);
}

#[test]
fn g12_an_adoption_the_store_gave_to_another_process_is_withdrawn() {
    let mut h = Harness::quiet();
    let s = SessionId(9);
    h.ev(Event::Adopt(Adoptee {
        session: s,
        parent: None,
        turns: 4,
        last_outcome: None,
        holds: Holds::default(),
        scope: Scope::SHARED,
    }));
    assert_eq!(
        h.try_ev(Event::Withdraw { session: s }),
        Ok(Handled::Applied)
    );
    assert_eq!(h.core.state(s), None);
    assert!(h.finalized().is_empty());
    h.ev(Event::BeginShutdown { drain: SEC });
    assert_eq!(
        h.try_ev(Event::Adopt(Adoptee {
            session: SessionId(10),
            parent: None,
            turns: 0,
            last_outcome: None,
            holds: Holds::default(),
            scope: Scope::SHARED,
        })),
        Err(Error::ShuttingDown)
    );
}

/// G3, G12: a held session keeps its holds across a handoff. Idle, it is
/// released at the handoff's start as any idle session is (its holds go
/// with it, so it has no reason to wait for the drain as a shutdown's held
/// session waits for a person); adopted with them, no automatic path takes it (no idle reap, no orphan
/// reap while no transport is attached) until the last hold is released.
#[test]
fn g3_g12_a_held_session_is_released_with_its_holds_and_adopted_held() {
    let mut h = Harness::quiet();
    let held = h.register(1, None);
    let kinds = [Hold::PendingInput, Hold::Delegation];
    for hold in kinds {
        h.ev(Event::Hold {
            session: held,
            hold,
        });
    }
    h.ev(Event::BeginHandoff { drain: SEC });
    let holds = Holds {
        pending_input: 1,
        delegation: 1,
    };
    assert_eq!(
        handed_off(&h),
        vec![HandOff {
            session: held,
            turns: 0,
            last_outcome: None,
            holds,
        }]
    );

    // Another process adopts it, held, with every reclaim path armed.
    let mut there = Harness::with(
        Policy::default()
            .idle_ttl(Some(10 * SEC))
            .orphan_grace(SEC)
            .lru_cap(None),
    );
    there.ev(Event::Adopt(Adoptee {
        session: held,
        parent: None,
        turns: 0,
        last_outcome: None,
        holds,
        scope: Scope::SHARED,
    }));
    there.ev(Event::TransportAttached {
        session: held,
        close_on_disconnect: false,
    });
    there.ev(Event::TransportDetached { session: held });
    there.advance(60 * SEC);
    there.ev(Event::Sweep(Sweep::Idle));
    there.ev(Event::Sweep(Sweep::Orphan));
    assert!(there.finalized().is_empty(), "G3: held, never reaped");
    assert_eq!(there.state(held), State::Registered);
    // Its holds end there: then it is reclaimable as any idle session.
    for hold in kinds {
        there.ev(Event::Release {
            session: held,
            hold,
        });
    }
    there.advance(60 * SEC);
    assert_eq!(there.finalized().len(), 1, "reclaimed once no hold is left");
}

/// Found from outside (G12): a process at its LRU cap that adopted
/// sessions handed off by another evicted its own idle sessions for them,
/// clients attached and all, so a rolling restart lost the sessions of
/// the processes it moved them onto. An adoption evicts nothing: at the
/// cap it is refused (the driver releases the session again, for another
/// process or later), and every session of this process stays.
#[test]
fn g12_an_adoption_at_the_cap_evicts_no_session_and_is_refused() {
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(2)));
    let mine = [h.register(1, None), h.register(2, None)];
    let adopt = Event::Adopt(Adoptee {
        session: SessionId(10),
        parent: None,
        turns: 3,
        last_outcome: Some(Outcome::Completed),
        holds: Holds::default(),
        scope: Scope::SHARED,
    });
    assert_eq!(h.try_ev(adopt), Err(Error::NoRoomToAdopt { cap: 2 }));
    assert!(h.finalized().is_empty(), "{:?}", h.finalized());
    for id in mine {
        assert_eq!(h.state(id), State::Registered);
    }
    assert_eq!(h.core.state(SessionId(10)), None);
    assert!(!h.core.is_handed_off(SessionId(10)));
}

fn adoptee(session: u64, parent: Option<u64>) -> Adoptee {
    Adoptee {
        session: SessionId(session),
        parent: parent.map(SessionId),
        turns: 1,
        last_outcome: Some(Outcome::Completed),
        holds: Holds::default(),
        scope: Scope::SHARED,
    }
}

/// G1, G12: a tree moves whole or not at all, and the core decides it. A
/// process with room for a tree's parent but not its child took the parent
/// and left the child released (another process could then adopt it under
/// a parent this one owns, and closing that parent would not wind the
/// child down first); the rule lived in the runtime's loop over single
/// adoptions. Refused, the tree leaves no trace in the core; admitted,
/// each member is under its parent whatever order the tree came in.
#[test]
fn g1_g12_a_tree_is_adopted_whole_or_not_at_all() {
    let mut h = Harness::with(Policy::default().idle_ttl(None).lru_cap(Some(3)));
    let mine = [h.register(1, None), h.register(2, None)];
    let logged = h.log.len();
    let tree = vec![adoptee(10, None), adoptee(11, Some(10))];
    assert_eq!(
        h.try_ev(Event::AdoptTree {
            members: tree.clone()
        }),
        Err(Error::NoRoomToAdopt { cap: 3 })
    );
    assert_eq!(h.log.len(), logged, "a refused tree orders nothing");
    for id in [10, 11] {
        assert_eq!(h.core.state(SessionId(id)), None, "session {id} taken");
    }
    // A member this core already has refuses the tree, naming it.
    assert_eq!(
        h.try_ev(Event::AdoptTree {
            members: vec![adoptee(12, None), adoptee(2, Some(12))]
        }),
        Err(Error::DuplicateSession(SessionId(2)))
    );
    assert_eq!(h.core.state(SessionId(12)), None);
    // With room for all of it: the child given first still goes under its
    // parent, and the parent's close winds the child down first (G1).
    h.ev(Event::UserClose { session: mine[0] });
    let grandchild = adoptee(22, Some(21));
    assert_eq!(
        h.try_ev(Event::AdoptTree {
            members: vec![grandchild, adoptee(21, Some(20)), adoptee(20, Some(99))]
        }),
        Err(Error::NoRoomToAdopt { cap: 3 }),
        "three more do not fit beside one"
    );
    h.ev(Event::UserClose { session: mine[1] });
    h.ev(Event::AdoptTree {
        members: vec![grandchild, adoptee(21, Some(20)), adoptee(20, Some(99))],
    });
    let parent = |id: u64| h.core.session(SessionId(id)).unwrap().parent();
    assert_eq!(parent(20), None, "its parent lives elsewhere: a root here");
    assert_eq!(parent(21), Some(SessionId(20)));
    assert_eq!(parent(22), Some(SessionId(21)));
    h.ev(Event::UserClose {
        session: SessionId(20),
    });
    let order: Vec<u64> = h.finalized().iter().map(|(id, _)| id.get()).collect();
    assert_eq!(order, vec![1, 2, 22, 21, 20], "children finalized first");
    assert_eq!(
        h.try_ev(Event::AdoptTree {
            members: Vec::new()
        }),
        Ok(Handled::NoOp)
    );
}
