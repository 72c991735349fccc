//! Seed 001: a cancel landing while a turn's stream is being attached, and a
//! work that ignores its cancellation.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use settle_runtime::{CancelMode, EndReason, Handled, Outcome, State, TurnRequest};
use settle_store::{MemoryStore, SessionStore};
use settle_stream::{
    Guarded, Provider, ProviderStream, Request, ScriptedEnd, ScriptedProvider, StreamError,
    TurnScript,
};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

/// A provider whose `open` has its stream in hand and then waits at a gate
/// before returning it: the window in which the stream exists but is not yet
/// attached to its turn. As the `Provider` contract asks, the stream is
/// guarded as soon as it exists, so a dropped `open` closes it.
struct Gated {
    inner: ScriptedProvider,
    entered: Notify,
    gate: Notify,
}

#[async_trait]
impl Provider for Gated {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        let stream = Guarded::new(self.inner.open_next()?);
        self.entered.notify_one();
        self.gate.notified().await;
        Ok(Box::new(stream))
    }
}

fn gated(script: TurnScript) -> Arc<Gated> {
    Arc::new(Gated {
        inner: ScriptedProvider::new([script]),
        entered: Notify::new(),
        gate: Notify::new(),
    })
}

#[tokio::test(start_paused = true)]
async fn g4_a_cancel_landing_while_the_stream_attaches_still_closes_it() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let session = runtime.register("agent", None).await.unwrap();
    let provider = gated(hang(&["never read"], 10 * MS));

    let turn = session
        .run_turn(provider.clone(), TurnRequest::prompt("go"))
        .await
        .unwrap();
    provider.entered.notified().await;
    // The stream exists and its attach is pending: the cancel lands now.
    assert_eq!(
        session.cancel(CancelMode::Immediate).await.unwrap(),
        Handled::Applied
    );
    provider.gate.notify_one();

    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    assert_eq!(session.finalized().await.unwrap(), EndReason::Cancelled);
    settle_tasks().await;
    let stats = provider.inner.stats();
    assert_eq!(stats.opened, 1);
    assert_eq!(stats.close_started, stats.opened, "{stats:?}");
    let d = detail(&store, session.id()).await;
    assert_eq!(d.session.outcome, Some(Outcome::Cancelled));
    assert!(d.turns[0].chunks.is_empty());
    assert_eq!(runtime.store_failures(), 0);
    runtime.shutdown(Duration::ZERO).await;
}

/// The other order: the stream is handed over and the cancel is sent in the
/// same instant, so the core may hear of the cancel before the attach. The
/// stream is closed exactly once either way.
#[tokio::test(start_paused = true)]
async fn g4_a_cancel_racing_the_attach_report_still_closes_the_stream_once() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let session = runtime.register("agent", None).await.unwrap();
    let provider = gated(hang(&["a", "b"], 10 * MS));

    let turn = session
        .run_turn(provider.clone(), TurnRequest::prompt("go"))
        .await
        .unwrap();
    provider.entered.notified().await;
    provider.gate.notify_one();
    assert_eq!(
        session.cancel(CancelMode::Immediate).await.unwrap(),
        Handled::Applied
    );

    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    assert_eq!(session.finalized().await.unwrap(), EndReason::Cancelled);
    settle_tasks().await;
    let stats = provider.inner.stats();
    assert_eq!((stats.opened, stats.close_started), (1, 1), "{stats:?}");
    runtime.shutdown(Duration::ZERO).await;
}

/// A cancel sent in the same instant the turn starts: whether the work had
/// opened its stream yet or not, what was opened is closed.
#[tokio::test(start_paused = true)]
async fn g4_a_cancel_as_the_turn_starts_closes_whatever_was_opened() {
    let store = MemoryStore::new();
    let runtime = runtime_on(&store, |b| b).await;
    let session = runtime.register("agent", None).await.unwrap();
    let p = provider([hang(&["a"], 10 * MS)]);
    let turn = start(&session, &p).await;
    assert_eq!(
        session.cancel(CancelMode::Immediate).await.unwrap(),
        Handled::Applied
    );
    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    assert_eq!(session.finalized().await.unwrap(), EndReason::Cancelled);
    settle_tasks().await;
    let stats = p.stats();
    assert_eq!(stats.opened, stats.close_started, "{stats:?}");
    runtime.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g5_a_work_ignoring_its_cancel_is_detached_after_the_settle_timeout() {
    let store = MemoryStore::new();
    let settle = Duration::from_millis(500);
    let runtime = runtime_on(&store, |b| b.settle_timeout(settle)).await;
    let session = runtime.register("agent", None).await.unwrap();
    let chunks = numbered("c", 100);
    let p = provider([TurnScript::new(chunks)
        .chunk_delay(100 * MS)
        .end(ScriptedEnd::IgnoreCancel)]);
    let mut turn = start(&session, &p).await;
    read_chunks(&mut turn, 2).await;

    let cancelled_at = Instant::now();
    assert_eq!(
        session.cancel(CancelMode::Immediate).await.unwrap(),
        Handled::Applied
    );
    assert_eq!(session.finalized().await.unwrap(), EndReason::Cancelled);
    let waited = cancelled_at.elapsed();
    assert!(waited >= settle && waited <= settle + 50 * MS, "{waited:?}");
    assert_eq!(turn.outcome().await, Outcome::Detached);

    // Its write access is revoked: the transcript no longer grows.
    let d = detail(&store, session.id()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let later = detail(&store, session.id()).await;
    assert_eq!(d.turns[0].chunks, later.turns[0].chunks);
    assert_eq!(later.session.outcome, Some(Outcome::Detached));
    assert_eq!(later.turns[0].outcome, Some(Outcome::Detached));
    assert!(store.memories(session.id()).await.unwrap().is_empty());
    assert_eq!(p.stats().close_started, 1);
    assert_eq!(runtime.store_failures(), 0);
    runtime.shutdown(Duration::ZERO).await;
}

#[tokio::test(start_paused = true)]
async fn g5_shutdown_ends_on_time_despite_a_work_ignoring_its_cancel() {
    let store = MemoryStore::new();
    let (settle, drain) = (Duration::from_secs(1), Duration::from_secs(2));
    let runtime = runtime_on(&store, |b| b.settle_timeout(settle)).await;
    let session = runtime.register("agent", None).await.unwrap();
    let p = provider([TurnScript::new(numbered("c", 100))
        .chunk_delay(100 * MS)
        .end(ScriptedEnd::IgnoreCancel)]);
    let mut turn = start(&session, &p).await;
    read_chunks(&mut turn, 2).await;

    let began = Instant::now();
    let report = runtime.shutdown(drain).await;
    let took = began.elapsed();
    assert!(took <= drain + settle + 100 * MS, "shutdown took {took:?}");
    assert!(
        took >= drain + settle,
        "the work had its settle time: {took:?}"
    );

    assert_eq!(report.cancelled, vec![session.id()]);
    assert_eq!(report.detached, vec![session.id()]);
    assert_eq!(report.finalized, vec![(session.id(), EndReason::Shutdown)]);
    assert!(report.drained.is_empty());
    assert_eq!(report.store_failures, 0);
    assert_eq!(turn.outcome().await, Outcome::Detached);
    let d = detail(&store, session.id()).await;
    assert_eq!(d.session.state, State::Finalized);
    assert_eq!(d.session.outcome, Some(Outcome::Detached));
    assert!(store.memories(session.id()).await.unwrap().is_empty());
}

/// G5 for a turn that ends on its own (its idle timeout here) and whose
/// stream will not close (a Python source swallowing its cancel, a server
/// that never acknowledges): the close is waited for at most the settle
/// timeout, then goes on by itself (G4: closed once, whenever it returns),
/// and the turn ends as it ended, its session free for the next turn, not
/// `running` for the whole close bound.
#[tokio::test(start_paused = true)]
async fn g5_a_turn_ending_on_its_own_waits_for_its_streams_close_at_most_the_settle_timeout() {
    let store = MemoryStore::new();
    let settle = Duration::from_millis(500);
    let idle = Duration::from_millis(300);
    let runtime = runtime_on(&store, |b| {
        b.settle_timeout(settle).idle_timeout(Some(idle))
    })
    .await;
    let session = runtime.register("agent", None).await.unwrap();
    let p = provider([
        TurnScript::new(["first"])
            .end(ScriptedEnd::Hang)
            .close_delay(Duration::from_secs(5)),
        TurnScript::new(["next"]),
    ]);
    let started = Instant::now();
    let mut turn = start(&session, &p).await;
    read_chunks(&mut turn, 1).await;
    assert_eq!(turn.outcome().await, Outcome::IdleTimeout);
    let took = started.elapsed();
    assert!(
        took <= idle + settle + 100 * MS,
        "the turn ended {took:?} after its start: its close held it"
    );
    assert_eq!(session.state().await.unwrap(), State::Registered);
    let mut next = start(&session, &p).await;
    assert_eq!(read_chunks(&mut next, 1).await, ["next"]);
    assert_eq!(next.outcome().await, Outcome::Completed);
    // The first stream's close went on, and finished once.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let stats = p.stats();
    assert_eq!(
        (stats.close_started, stats.close_finished),
        (2, 2),
        "{stats:?}"
    );
    runtime.shutdown(Duration::ZERO).await;
}

/// A kernel-wide first-event timeout (`settle serve` and `settle chat`
/// give it as `--first-event-timeout`): a turn whose stream sends nothing
/// within it ends `idle_timeout` then, however long the idle timeout; one
/// longer than the idle timeout lets a model slow to start answer, the
/// idle timeout applying between its events.
#[tokio::test(start_paused = true)]
async fn a_kernels_first_event_timeout_bounds_the_wait_for_a_turns_first_event() {
    let idle = Duration::from_secs(3);
    for (first, outcome) in [
        (Duration::from_secs(2), Outcome::IdleTimeout),
        (Duration::from_secs(10), Outcome::Completed),
    ] {
        let store = MemoryStore::new();
        let runtime = runtime_on(&store, |b| {
            b.idle_timeout(Some(idle)).first_event_timeout(Some(first))
        })
        .await;
        let session = runtime.register("agent", None).await.unwrap();
        // Its one event after 5 s, past the idle timeout.
        let p = provider([TurnScript::new(["late"]).chunk_delay(Duration::from_secs(5))]);
        let started = Instant::now();
        let turn = start(&session, &p).await;
        assert_eq!(
            turn.outcome().await,
            outcome,
            "first-event timeout {first:?}"
        );
        if outcome == Outcome::IdleTimeout {
            let took = started.elapsed();
            assert!(
                took < idle,
                "ended {took:?} after its start, past {first:?}"
            );
        }
        runtime.shutdown(Duration::ZERO).await;
    }
}

/// SPEC §7: a session's outcome is "of the last turn or of the work". A
/// session whose only work was a task that ignored its cancel said `null`
/// though its timeline read `settle deadline passed: work detached` (found
/// from outside, through the Python package); one whose task completed
/// said `null` too. A turn's outcome still wins over a task's, and only a
/// turn's completion commits memory (G7).
#[tokio::test(start_paused = true)]
async fn g5_a_session_whose_only_work_was_a_task_ends_with_that_works_outcome() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b.settle_timeout(Duration::from_secs(1))).await;
    let stubborn = kernel.register("stubborn", None).await.unwrap();
    let _task = stubborn
        .spawn(|_ctx| std::future::pending::<()>())
        .await
        .unwrap();
    let closed = stubborn.clone();
    let closing = tokio::spawn(async move { closed.close().await });
    tokio::time::sleep(Duration::from_secs(2)).await;
    closing.await.unwrap().unwrap();
    let d = detail(&store, stubborn.id()).await;
    assert_eq!(d.session.state, State::Finalized);
    assert_eq!(d.session.outcome, Some(Outcome::Detached));

    let tool = kernel.register("tool", None).await.unwrap();
    tool.spawn(|_ctx| async {}).await.unwrap().await.unwrap();
    tool.finish().await.unwrap();
    let d = detail(&store, tool.id()).await;
    assert_eq!(d.session.outcome, Some(Outcome::Completed));
}
