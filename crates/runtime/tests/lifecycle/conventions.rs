//! The shapes a Rust user expects: a task handle that is a future, a guard
//! that disarms like tokio-util's `DropGuard`, `parent.child(name)`, a turn
//! whose error is seen in line, predicates on errors.

use std::time::Duration;

use futures_util::StreamExt;
use settle_runtime::{State, TurnRequest};
use settle_store::MemoryStore;
use settle_stream::{ScriptedEnd, TurnScript};

use crate::common::*;

#[tokio::test(start_paused = true)]
async fn a_task_handle_is_awaited_like_a_join_handle() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let task = agent.spawn(|_ctx| async { 6 * 7 }).await.unwrap();
    assert_eq!(task.await.unwrap(), 42);
}

#[tokio::test(start_paused = true)]
async fn a_disarmed_guard_leaves_its_session_open_and_child_registers_under_it() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let root = kernel.register("root", None).await.unwrap().guard();
    let child = root.child("child").await.unwrap();
    assert_eq!(child.parent(), Some(root.id()));
    let root = root.disarm();
    settle_tasks().await;
    assert_eq!(root.state().await.unwrap(), State::Registered);
    assert_eq!(child.state().await.unwrap(), State::Registered);
}

#[tokio::test(start_paused = true)]
async fn a_turns_results_end_with_its_error_in_line() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let failing = provider([TurnScript::new(["partial"]).end(ScriptedEnd::Fail)]);
    let items: Vec<_> = agent
        .run_turn(failing, TurnRequest::prompt("go"))
        .await
        .unwrap()
        .results()
        .collect()
        .await;
    assert_eq!(items.len(), 2);
    assert_eq!(items[0].as_ref().unwrap().as_text(), Some("partial"));
    assert!(items[1].is_err());
    let ok = provider([complete(&["fine"], Duration::ZERO)]);
    let items: Vec<_> = agent
        .run_turn(ok, TurnRequest::prompt("go"))
        .await
        .unwrap()
        .results()
        .collect()
        .await;
    assert_eq!(items.len(), 1, "a completed turn ends with its last chunk");
    agent.close().await.unwrap();
    let refused = agent
        .run_turn(provider([]), TurnRequest::prompt("more"))
        .await
        .unwrap_err();
    assert!(refused.is_session_closed());
    assert!(!refused.is_budget_exhausted());
}

/// G10 is for a detached task, not one that ended: a task's end is
/// reported to the driver before its result is handed to its caller, and
/// the driver's dropping the ended work's handle revoked its write access
/// in between, so that the result was refused and the caller told the
/// kernel had stopped (found from outside: 1 in about 25,000 tasks in a
/// soak of the Python package). Many short tasks at once on two threads,
/// each joined: every one gives its value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g10_a_task_that_returned_gives_its_value_however_fast_its_end_is_taken() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let mut lost = Vec::new();
    for round in 0..400u32 {
        let tasks = futures_util::future::join_all((0..500u32).map(|i| {
            let agent = agent.clone();
            async move {
                let task = agent.spawn(move |_ctx| async move { i }).await.unwrap();
                (i, task.await)
            }
        }))
        .await;
        for (i, joined) in tasks {
            if joined.as_ref().ok() != Some(&i) {
                lost.push((round, i, format!("{joined:?}")));
            }
        }
    }
    assert!(lost.is_empty(), "tasks that lost their value: {lost:?}");
}
