//! Seed 000: the root finishes while its descendants are mid-turn.

use std::time::Duration;

use settle_runtime::{EndReason, Outcome, State};
use settle_store::{MemoryStore, SessionStore};

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

#[tokio::test(start_paused = true)]
async fn g1_root_finish_settles_and_finalizes_descendants_before_the_root() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let mut events = runtime.subscribe();

    let root = runtime.register("root", None).await.unwrap();
    let child = runtime.register("recon", Some(root.id())).await.unwrap();
    let grandchild = runtime.register("scan", Some(child.id())).await.unwrap();

    let root_provider = provider([complete(&["plan", "report written"], 10 * MS)]);
    let child_provider = provider([hang(&["port 22", "port 80"], 10 * MS)]);
    let grandchild_provider = provider([hang(&["probing"], 10 * MS)]);

    let mut child_turn = start(&child, &child_provider).await;
    let mut grandchild_turn = start(&grandchild, &grandchild_provider).await;
    read_chunks(&mut child_turn, 1).await;
    read_chunks(&mut grandchild_turn, 1).await;

    // The root's own turn completes; then it finishes with both descendants
    // still mid-turn, their streams open.
    let root_turn = start(&root, &root_provider).await;
    assert_eq!(root_turn.outcome().await, Outcome::Completed);
    assert_eq!(root.finish().await.unwrap(), EndReason::Completed);

    // Every descendant was cancelled, its work exited and its stream closed.
    assert_eq!(child_turn.outcome().await, Outcome::Cancelled);
    assert_eq!(grandchild_turn.outcome().await, Outcome::Cancelled);
    for p in [&child_provider, &grandchild_provider, &root_provider] {
        let stats = p.stats();
        assert_eq!((stats.opened, stats.close_started), (1, 1), "{stats:?}");
    }

    // Finalized children before parents, the root last.
    let seen = drain(&mut events);
    let order = finalized(&seen);
    assert_eq!(
        order,
        vec![
            (grandchild.id(), EndReason::ParentFinished),
            (child.id(), EndReason::ParentFinished),
            (root.id(), EndReason::Completed),
        ]
    );
    // Nothing reported the store closed under a live child.
    assert_eq!(store_failed(&seen), Vec::<String>::new());
    assert_eq!(runtime.store_failures(), 0);

    let root_row = detail(&store, root.id()).await.session;
    assert_eq!(root_row.outcome, Some(Outcome::Completed));
    assert_eq!(root_row.end_reason, Some(EndReason::Completed));
    for id in [child.id(), grandchild.id()] {
        let d = detail(&store, id).await;
        assert_eq!(d.session.state, State::Finalized);
        assert_eq!(d.session.outcome, Some(Outcome::Cancelled));
        assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled));
        // Each descendant settled (its work ended) before it was finalized.
        let states: Vec<State> = d.timeline.iter().map(|t| t.to).collect();
        let settled = states.iter().position(|s| *s == State::Settled);
        let finalized = states.iter().position(|s| *s == State::Finalized);
        assert!(settled < finalized, "{states:?}");
    }
    // Durable finalize times agree with the order (to the millisecond).
    let rows = store
        .list_sessions(settle_store::SessionFilter::all().oldest_first())
        .await
        .unwrap();
    let at = |id| {
        rows.iter()
            .find(|r| r.id == id)
            .unwrap()
            .finalized_at
            .unwrap()
    };
    assert!(at(grandchild.id()) <= at(child.id()));
    assert!(at(child.id()) <= at(root.id()));

    let report = runtime.shutdown(Duration::ZERO).await;
    assert_eq!(report.store_failures, 0);
}

/// The seed's own shape: the root finishes while a child is mid-turn; here
/// it does so with its own stream still open, which cuts that turn short.
#[tokio::test(start_paused = true)]
async fn g1_root_finishing_inside_its_own_turn_settles_the_child_first() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let mut events = runtime.subscribe();

    let root = runtime.register("root", None).await.unwrap();
    let child = runtime.register("child", Some(root.id())).await.unwrap();
    let root_provider = provider([hang(&["calling finish"], 10 * MS)]);
    let child_provider = provider([hang(&["working"], 10 * MS)]);

    let mut child_turn = start(&child, &child_provider).await;
    read_chunks(&mut child_turn, 1).await;
    let mut root_turn = start(&root, &root_provider).await;
    read_chunks(&mut root_turn, 1).await;

    // Finishing cuts the root's own turn short: it is recorded cancelled,
    // not completed (G7), and the root ends `cancelled`.
    assert_eq!(root.finish().await.unwrap(), EndReason::Cancelled);
    assert_eq!(child_turn.outcome().await, Outcome::Cancelled);
    assert_eq!(root_turn.outcome().await, Outcome::Cancelled);
    settle_tasks().await;

    let seen = drain(&mut events);
    let order = finalized(&seen);
    assert!(position(&order, child.id()) < position(&order, root.id()));
    assert_eq!(store_failed(&seen), Vec::<String>::new());
    assert_eq!(runtime.store_failures(), 0);
    for p in [&root_provider, &child_provider] {
        let stats = p.stats();
        assert_eq!(stats.opened, stats.close_started, "{stats:?}");
    }
    let root_detail = detail(&store, root.id()).await;
    assert_eq!(root_detail.session.outcome, Some(Outcome::Cancelled));
    assert_eq!(root_detail.session.end_reason, Some(EndReason::Cancelled));
    assert_eq!(
        root_detail.turns[0]
            .chunks
            .iter()
            .map(|c| c.text.as_str())
            .collect::<Vec<_>>(),
        vec!["calling finish"]
    );

    let report = runtime.shutdown(Duration::ZERO).await;
    assert_eq!(report.store_failures, 0);
}

/// A leaf agent finishing from inside its own turn: the turn is cancelled
/// and the finalize waits for its work to exit, so nothing is written after it.
#[tokio::test(start_paused = true)]
async fn g1_a_leaf_finishing_inside_its_turn_writes_nothing_after_its_finalize() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let mut events = runtime.subscribe();

    let agent = runtime.register("agent", None).await.unwrap();
    let p = provider([hang(&["done, calling finish"], 10 * MS)]);
    let mut turn = start(&agent, &p).await;
    read_chunks(&mut turn, 1).await;
    assert_eq!(agent.finish().await.unwrap(), EndReason::Cancelled);
    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    settle_tasks().await;

    let seen = drain(&mut events);
    assert_eq!(store_failed(&seen), Vec::<String>::new());
    assert_eq!(runtime.store_failures(), 0);
    assert_eq!(p.stats().close_started, 1);
    let d = detail(&store, agent.id()).await;
    assert_eq!(d.session.outcome, Some(Outcome::Cancelled));
    assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled));
    // Its cut turn is not whole: no memory is committed from it (G7).
    assert!(store.memories(agent.id()).await.unwrap().is_empty());
    runtime.shutdown(Duration::ZERO).await;
}

/// A graceful cancel of a coordinator lets its children's running turns
/// finish, as its own: their streams are not cut, their turns complete and
/// their memory is committed; they are finalized before it (G1).
#[tokio::test(start_paused = true)]
async fn g1_a_graceful_cancel_of_a_coordinator_lets_its_childrens_turns_finish() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let mut events = runtime.subscribe();

    let root = runtime.register("coordinator", None).await.unwrap();
    let child = runtime.register("recon", Some(root.id())).await.unwrap();
    let root_provider = provider([complete(&["plan", "summary"], 100 * MS)]);
    let child_provider = provider([complete(&["port 22", "port 80", "done"], 100 * MS)]);

    let mut child_turn = start(&child, &child_provider).await;
    let root_turn = start(&root, &root_provider).await;
    read_chunks(&mut child_turn, 1).await;

    applied(root.cancel(settle_runtime::CancelMode::Graceful).await);

    assert_eq!(child_turn.outcome().await, Outcome::Completed);
    assert_eq!(root_turn.outcome().await, Outcome::Completed);
    assert_eq!(root.finalized().await.unwrap(), EndReason::Cancelled);
    let child_row = detail(&store, child.id()).await;
    assert_eq!(child_row.turns[0].outcome, Some(Outcome::Completed));
    assert_eq!(
        child_row.turns[0].chunks.len(),
        3,
        "the child's turn ran out"
    );
    assert_eq!(
        finalized(&drain(&mut events)),
        vec![
            (child.id(), EndReason::Cancelled),
            (root.id(), EndReason::Cancelled),
        ]
    );
    runtime.shutdown(Duration::ZERO).await;
}
