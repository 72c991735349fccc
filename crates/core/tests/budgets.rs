//! Budgets per session and subtree: turns, tokens from usage reports, wall
//! time; inherited by children; exceeding one cancels the subtree,
//! descendants first (G1), and finalizes it `budget_exhausted`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::time::Duration;

use settle_core::{
    Budget, BudgetLimit, Cause, DeadlineKind, Effect, EndReason, Error, Event, Handled, Outcome,
    SessionId, State,
};
use support::{Harness, SEC};

fn budget(h: &mut Harness, session: SessionId, budget: Budget) {
    assert_eq!(
        h.try_ev(Event::SetBudget { session, budget }),
        Ok(Handled::Applied)
    );
}

fn complete(h: &mut Harness, session: SessionId) {
    let work = h.attached_turn(session);
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Completed,
    });
}

#[test]
fn g1_a_turn_past_the_budget_is_refused_and_winds_the_subtree_down_children_first() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    budget(&mut h, root, Budget::default().turns(2));
    let child = h.register(2, Some(1));
    let grandchild = h.register(3, Some(2));
    // Turns anywhere in the subtree count against the root's budget.
    complete(&mut h, root);
    let live = h.attached_turn(grandchild);
    let refused = h.try_ev(Event::StartTurn { session: child });
    assert_eq!(
        refused,
        Err(Error::BudgetExhausted {
            session: root,
            limit: BudgetLimit::Turns
        })
    );
    // The grandchild's live turn is cancelled; nothing is finalized while it runs.
    assert_eq!(h.cancels_of(grandchild), 1);
    assert!(h.finalized().is_empty());
    assert_eq!(h.state(root), State::Cancelling);
    h.ev(Event::WorkEnded {
        work: live,
        outcome: Outcome::Cancelled,
    });
    assert_eq!(
        h.finalized(),
        [
            (grandchild, EndReason::BudgetExhausted),
            (child, EndReason::BudgetExhausted),
            (root, EndReason::BudgetExhausted),
        ]
    );
    let cause = Cause::BudgetExhausted(BudgetLimit::Turns);
    assert!(h.log.iter().any(|e| matches!(e,
        Effect::Transition(t) if t.session == root && t.cause == cause)));
}

#[test]
fn tokens_past_the_budget_cancel_the_subtree_at_once() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let child = h.register(2, Some(1));
    budget(&mut h, root, Budget::default().tokens(100));
    let work = h.attached_turn(child);
    assert_eq!(
        h.try_ev(Event::Usage { work, tokens: 60 }),
        Ok(Handled::Applied)
    );
    assert_eq!(h.cancels_of(child), 0, "60 of 100 spent");
    h.ev(Event::Usage { work, tokens: 40 });
    assert_eq!(
        h.cancels_of(child),
        0,
        "the most tokens spent, none past it"
    );
    h.ev(Event::Usage { work, tokens: 1 });
    assert_eq!(h.cancels_of(child), 1);
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Cancelled,
    });
    assert_eq!(
        h.finalized(),
        [
            (child, EndReason::BudgetExhausted),
            (root, EndReason::BudgetExhausted)
        ]
    );
}

#[test]
fn a_childs_own_budget_winds_down_only_its_own_subtree() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    budget(&mut h, root, Budget::default().tokens(1000));
    let child = h.register(2, Some(1));
    budget(&mut h, child, Budget::default().tokens(10));
    let work = h.attached_turn(child);
    h.ev(Event::Usage { work, tokens: 11 });
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Cancelled,
    });
    assert_eq!(h.finalized(), [(child, EndReason::BudgetExhausted)]);
    assert_eq!(h.state(root), State::Registered);
    // The root's budget counted the child's tokens too.
    let root_turn = h.attached_turn(root);
    h.ev(Event::Usage {
        work: root_turn,
        tokens: 990,
    });
    assert_eq!(h.cancels_of(root), 1, "11 + 990 > 1000");
}

#[test]
fn the_wall_time_of_a_budget_is_a_deadline_of_the_core() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    budget(&mut h, root, Budget::default().wall_time(10 * SEC));
    let deadline = h.core.poll_timeout().unwrap();
    assert_eq!(deadline.kind, DeadlineKind::Budget);
    h.advance(9 * SEC);
    assert!(h.finalized().is_empty());
    h.advance(Duration::from_secs(1));
    assert_eq!(h.finalized(), [(root, EndReason::BudgetExhausted)]);
    assert_eq!(h.core.poll_timeout(), None);
}

#[test]
fn usage_without_a_budget_changes_nothing_and_a_finalized_sessions_is_a_no_op() {
    let mut h = Harness::quiet();
    let root = h.register(1, None);
    let work = h.attached_turn(root);
    assert_eq!(
        h.try_ev(Event::Usage {
            work,
            tokens: 1 << 40
        }),
        Ok(Handled::Applied)
    );
    assert_eq!(h.cancels_of(root), 0);
    h.ev(Event::UserClose { session: root });
    h.ev(Event::WorkEnded {
        work,
        outcome: Outcome::Cancelled,
    });
    assert_eq!(
        h.try_ev(Event::Usage { work, tokens: 1 }),
        Ok(Handled::NoOp)
    );
    assert_eq!(
        h.try_ev(Event::SetBudget {
            session: root,
            budget: Budget::default()
        }),
        Err(Error::SessionClosed(root))
    );
}

#[test]
fn a_budget_with_no_limit_set_limits_nothing_and_each_limit_is_a_limit() {
    assert!(Budget::default().is_unlimited());
    assert!(!Budget::default().turns(1).is_unlimited());
    assert!(!Budget::default().tokens(1).is_unlimited());
    assert!(!Budget::default().wall_time(SEC).is_unlimited());
}

#[test]
fn a_spent_limit_is_named_in_words_in_the_refusal() {
    let named = [
        (BudgetLimit::Turns, "turns"),
        (BudgetLimit::Tokens, "tokens"),
        (BudgetLimit::WallTime, "wall time"),
    ];
    for (limit, name) in named {
        assert_eq!(limit.to_string(), name);
        let refused = Error::BudgetExhausted {
            session: SessionId(7),
            limit,
        };
        assert!(refused.to_string().contains(name), "{refused} names {name}");
    }
}

/// A budget set again replaces the wall time of the one before: once the
/// core is woken, it waits for the new deadline, not the replaced one.
#[test]
fn a_replaced_wall_time_is_not_waited_for() {
    let mut h = Harness::quiet();
    let s = h.register(1, None);
    budget(&mut h, s, Budget::default().wall_time(10 * SEC));
    budget(&mut h, s, Budget::default().wall_time(60 * SEC));
    h.tick(SEC);
    let next = h.core.poll_timeout().unwrap();
    assert_eq!(
        (next.at, next.kind),
        (h.start + 60 * SEC, DeadlineKind::Budget)
    );
    h.tick(10 * SEC);
    assert_eq!(
        h.state(s),
        State::Registered,
        "the replaced wall time spent nothing"
    );
    h.tick(60 * SEC);
    assert_eq!(
        h.finalize_of(s).map(|f| f.reason),
        Some(EndReason::BudgetExhausted)
    );
}
