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
