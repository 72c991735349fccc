//! Helpers shared by the lifecycle tests: runtimes on a [`MemoryStore`]
//! (for tokio's paused clock), scripted turns, and readers of the event
//! stream and the store.

use std::sync::Arc;
use std::time::Duration;

use settle_runtime::{
    EndReason, Kernel, KernelBuilder, LifecycleEvent, SessionHandle, SessionId, Turn, TurnRequest,
};
use settle_store::{MemoryStore, SessionDetail, SessionStore};
use settle_stream::{ScriptedEnd, ScriptedProvider, TurnScript};
use tokio::sync::broadcast;

/// A runtime on `store`, tuned by `tune`, with no idle timeout (a hung
/// stream must only end when a test says so) unless `tune` sets one.
pub async fn runtime_on(
    store: &MemoryStore,
    tune: impl FnOnce(KernelBuilder) -> KernelBuilder,
) -> Kernel {
    let builder = Kernel::builder(Arc::new(store.clone())).idle_timeout(None);
    tune(builder).start().await.expect("the runtime starts")
}

/// A provider playing `turns`.
pub fn provider(turns: impl IntoIterator<Item = TurnScript>) -> Arc<ScriptedProvider> {
    Arc::new(ScriptedProvider::new(turns))
}

/// A turn that streams a chunk every 100 ms and ignores its cancel: its
/// work unwinds only when detached at the settle deadline (G5).
pub fn ignores_cancel() -> TurnScript {
    TurnScript::new(numbered("c", 100))
        .chunk_delay(Duration::from_millis(100))
        .end(ScriptedEnd::IgnoreCancel)
}

/// A turn that streams `chunks` (one every `delay`) and then hangs open.
pub fn hang(chunks: &[&str], delay: Duration) -> TurnScript {
    TurnScript::new(chunks.iter().copied())
        .chunk_delay(delay)
        .end(ScriptedEnd::Hang)
}

/// A turn that streams `chunks` (one every `delay`) and completes.
pub fn complete(chunks: &[&str], delay: Duration) -> TurnScript {
    TurnScript::new(chunks.iter().copied()).chunk_delay(delay)
}

/// `n` chunks named `prefix-0`, `prefix-1`, ...
pub fn numbered(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

/// Starts a turn of `session` on `provider`.
pub async fn start(session: &SessionHandle, provider: &Arc<ScriptedProvider>) -> Turn {
    session
        .run_turn(provider.clone(), TurnRequest::prompt("go"))
        .await
        .expect("the turn starts")
}

/// Reads `n` persisted chunks of `turn`.
pub async fn read_chunks(turn: &mut Turn, n: usize) -> Vec<String> {
    let mut read = Vec::with_capacity(n);
    for _ in 0..n {
        read.push(turn.next_chunk().await.expect("a chunk").into_payload());
    }
    read
}

/// The store's view of one session.
pub async fn detail(store: &MemoryStore, id: SessionId) -> SessionDetail {
    store.session_detail(id).await.expect("the session exists")
}

/// Every event received so far, without waiting.
pub fn drain(events: &mut broadcast::Receiver<LifecycleEvent>) -> Vec<LifecycleEvent> {
    let mut seen = Vec::new();
    loop {
        match events.try_recv() {
            Ok(event) => seen.push(event),
            Err(broadcast::error::TryRecvError::Lagged(n)) => panic!("missed {n} events"),
            Err(_) => return seen,
        }
    }
}

/// The sessions finalized, in the order the finalize plans ran, with reasons.
pub fn finalized(events: &[LifecycleEvent]) -> Vec<(SessionId, EndReason)> {
    events
        .iter()
        .filter_map(|e| match e {
            LifecycleEvent::Finalized {
                session, reason, ..
            } => Some((*session, *reason)),
            _ => None,
        })
        .collect()
}

/// Whether any store write failed, as the event stream tells it.
pub fn store_failed(events: &[LifecycleEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            LifecycleEvent::StoreFailed { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

/// What the event stream said of store writes tried again.
pub fn store_retrying(events: &[LifecycleEvent]) -> Vec<String> {
    events
        .iter()
        .filter_map(|e| match e {
            LifecycleEvent::StoreRetrying { message, .. } => Some(message.clone()),
            _ => None,
        })
        .collect()
}

/// Where `session` comes in `order`.
pub fn position(order: &[(SessionId, EndReason)], session: SessionId) -> usize {
    order
        .iter()
        .position(|(s, _)| *s == session)
        .unwrap_or_else(|| panic!("session {session} was not finalized: {order:?}"))
}

/// Lets every task that can run, run (the paused clock does not move).
pub async fn settle_tasks() {
    for _ in 0..64 {
        tokio::task::yield_now().await;
    }
}

/// Asserts that the runtime applied a request.
#[track_caller]
pub fn applied(result: Result<settle_runtime::Handled, settle_runtime::RuntimeError>) {
    assert!(
        matches!(result, Ok(settle_runtime::Handled::Applied)),
        "{result:?}"
    );
}
