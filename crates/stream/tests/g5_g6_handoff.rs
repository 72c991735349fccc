//! The turn handoff of seed 001: attach before produce, cancel, bounded
//! settle, detach (G4, G5, G6).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{Log, Recording, Step};
use futures_util::StreamExt;
use settle_core::{CancelMode, Outcome};
use settle_stream::{
    settle, CancelIssued, CancellationToken, CancelledBy, Chunk, Cut, FnSink, ForceClosed, Guarded,
    Provider, ProviderStream, Request, Scope, ScriptStats, ScriptedEnd, ScriptedProvider,
    StreamError, StreamErrorKind, Turn, TurnEnd, TurnOptions, TurnScript,
};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

/// A sink that records each chunk in the log.
fn log_sink(log: &Log) -> FnSink<impl FnMut(Chunk) -> Result<(), settle_stream::SinkError>> {
    let log = log.clone();
    FnSink(move |chunk: Chunk| {
        log.push(format!("chunk {}", chunk.payload()));
        Ok(())
    })
}

fn options(idle: Duration) -> TurnOptions {
    TurnOptions {
        idle_timeout: idle,
        first_event_timeout: None,
    }
}

fn recorder(log: &Log) -> impl FnOnce(settle_stream::TurnId) + Send {
    let log = log.clone();
    move |_| log.push("detach")
}

/// A provider whose `open` takes `open_delay` after creating its stream, as
/// when a stream is made before the response is ready: a cancel in between
/// must still close that stream.
struct SlowOpen {
    log: Log,
    steps: Vec<Step>,
    open_delay: Duration,
}

#[async_trait]
impl Provider for SlowOpen {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        self.log.push("open");
        let stream = Guarded::new(Recording::new(&self.log, self.steps.clone()));
        tokio::time::sleep(self.open_delay).await;
        self.log.push("opened");
        Ok(Box::new(stream))
    }
}

#[tokio::test(start_paused = true)]
async fn g4_cancel_before_attach_never_opens_a_stream() {
    let session = CancellationToken::new();
    session.cancel();
    let provider = ScriptedProvider::new([TurnScript::new(["never"])]);
    let log = Log::default();
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &session,
        log_sink(&log),
        options(5 * S),
    );
    assert!(matches!(
        turn.exited().await,
        TurnEnd::Cancelled(CancelledBy::Request)
    ));
    assert_eq!(
        provider.stats(),
        ScriptStats::default(),
        "nothing was opened"
    );
    assert!(log.entries().is_empty());
}

#[tokio::test(start_paused = true)]
async fn g4_cancel_before_attach_closes_an_existing_stream_at_attach() {
    let log = Log::default();
    let stream = Recording::new(&log, [Step::Chunk("never")]);
    let session = CancellationToken::new();
    let scope = Scope::new(&session);
    session.cancel();
    let mut attached = scope.attach(stream);
    assert!(
        attached.next().await.is_none(),
        "produced nothing after a cancel"
    );
    assert_eq!(scope.close_handle().cut(), Some(Cut::Cancelled));
    drop(attached);
    assert_eq!(log.entries(), ["close", "closed"]);
}

#[tokio::test(start_paused = true)]
async fn g4_cancel_during_attach_cancels_the_run_and_closes_the_stream() {
    let log = Log::default();
    let provider = SlowOpen {
        log: log.clone(),
        steps: vec![Step::Chunk("never")],
        open_delay: S,
    };
    let session = CancellationToken::new();
    let turn = Turn::spawn(
        Arc::new(provider),
        Request::prompt("hi"),
        &session,
        log_sink(&log),
        options(5 * S),
    );
    tokio::time::sleep(S / 2).await;
    assert_eq!(log.entries(), ["open"]);
    session.cancel();
    let settled = settle(turn, S, recorder(&log)).await;
    assert!(matches!(
        settled.end,
        TurnEnd::Cancelled(CancelledBy::Request)
    ));
    assert_eq!(settled.outcome(), Outcome::Cancelled);
    assert_eq!(log.entries(), ["open", "close", "closed", "detach"]);
}

#[tokio::test(start_paused = true)]
async fn g4_cancel_mid_stream_closes_then_detaches() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b", "c", "d"]).chunk_delay(S)]);
    let log = Log::default();
    let session = CancellationToken::new();
    let turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &session,
        log_sink(&log),
        options(5 * S),
    );
    tokio::time::sleep(2 * S + 500 * MS).await;
    let started = Instant::now();
    let settled = settle(turn, S, {
        let provider = provider.clone();
        let log = log.clone();
        move |_| {
            let stats = provider.stats();
            log.push(format!("detach after {} close", stats.close_finished));
        }
    })
    .await;
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a sync close unwinds at once"
    );
    assert!(settled.cancelled);
    assert!(matches!(
        settled.end,
        TurnEnd::Cancelled(CancelledBy::Request)
    ));
    assert_eq!(
        log.entries(),
        ["chunk a", "chunk b", "detach after 1 close"]
    );
    assert_eq!(
        provider.stats(),
        ScriptStats {
            opened: 1,
            close_started: 1,
            close_finished: 1
        }
    );
}

#[tokio::test(start_paused = true)]
async fn g4_slow_close_finishes_within_the_settle_bound_before_detach() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"])
        .chunk_delay(S)
        .end(ScriptedEnd::Hang)
        .close_delay(300 * MS)]);
    let session = CancellationToken::new();
    let log = Log::default();
    let turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &session,
        log_sink(&log),
        options(60 * S),
    );
    tokio::time::sleep(5 * S).await;
    let started = Instant::now();
    let stats_at_detach = Arc::new(Mutex::new(None));
    let settled = settle(turn, S, {
        let provider = provider.clone();
        let stats_at_detach = stats_at_detach.clone();
        move |_| *stats_at_detach.lock().unwrap() = Some(provider.stats())
    })
    .await;
    assert_eq!(
        started.elapsed(),
        300 * MS,
        "settle waited for the slow close"
    );
    assert!(matches!(
        settled.end,
        TurnEnd::Cancelled(CancelledBy::Request)
    ));
    let at_detach = stats_at_detach.lock().unwrap().unwrap();
    assert_eq!((at_detach.close_started, at_detach.close_finished), (1, 1));
    tokio::time::sleep(10 * S).await;
    assert_eq!(provider.stats().close_started, 1);
}

#[tokio::test(start_paused = true)]
async fn g5_ignore_cancel_is_detached_at_the_settle_deadline() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b", "c", "d"])
        .chunk_delay(S)
        .end(ScriptedEnd::IgnoreCancel)
        .ignore(60 * S)]);
    let session = CancellationToken::new();
    let log = Log::default();
    let turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &session,
        log_sink(&log),
        options(5 * S),
    );
    tokio::time::sleep(2 * S + 500 * MS).await;
    let started = Instant::now();
    let settled = settle(turn, S, {
        let log = log.clone();
        let provider = provider.clone();
        move |_| {
            log.push(format!(
                "detach, closes started {}",
                provider.stats().close_started
            ))
        }
    })
    .await;
    assert_eq!(
        started.elapsed(),
        S,
        "G5: no longer than the settle timeout"
    );
    assert!(matches!(settled.end, TurnEnd::Detached));
    assert_eq!(settled.outcome(), Outcome::Detached);
    assert_eq!(
        log.entries(),
        ["chunk a", "chunk b", "detach, closes started 1"]
    );
    // The abandoned close still finishes, once, after the ignore period.
    assert_eq!(provider.stats().close_finished, 0);
    tokio::time::sleep(61 * S).await;
    assert_eq!(
        provider.stats(),
        ScriptStats {
            opened: 1,
            close_started: 1,
            close_finished: 1
        }
    );
    assert_eq!(
        log.count("chunk c"),
        0,
        "a detached turn writes nothing more"
    );
}

#[tokio::test(start_paused = true)]
async fn g5_ignore_cancel_genuinely_ignores_the_cancel() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"])
        .chunk_delay(S)
        .end(ScriptedEnd::IgnoreCancel)
        .ignore(10 * S)]);
    let session = CancellationToken::new();
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &session,
        FnSink(|_| Ok(())),
        options(60 * S),
    );
    tokio::time::sleep(1500 * MS).await;
    assert_eq!(turn.cancel(CancelMode::Immediate), CancelIssued::Cancelled);
    let started = Instant::now();
    let end = turn.exited().await;
    assert_eq!(
        started.elapsed(),
        10 * S,
        "the work ran on for `ignore` after cancel"
    );
    assert!(matches!(end, TurnEnd::Cancelled(CancelledBy::Request)));
}

#[tokio::test(start_paused = true)]
async fn g5_a_stuck_work_has_its_stream_force_closed_from_outside() {
    // The work is a thread blocked outside any await point: aborting cannot
    // reach it, only the close handle can.
    let log = Log::default();
    let session = CancellationToken::new();
    let scope = Scope::new(&session);
    let mut stream = scope.attach(Recording::new(&log, [Step::Chunk("a"), Step::Hang]));
    assert!(stream.next().await.unwrap().is_ok());
    let (release, blocked) = std::sync::mpsc::channel::<()>();
    let work = std::thread::spawn(move || {
        blocked.recv().unwrap();
        drop(stream);
    });
    assert_eq!(scope.close_handle().close(), ForceClosed::Closed);
    log.push("detach");
    assert_eq!(scope.close_handle().close(), ForceClosed::NothingOpen);
    release.send(()).unwrap();
    work.join().unwrap();
    assert_eq!(log.entries(), ["close", "closed", "detach"]);
}

#[tokio::test(start_paused = true)]
async fn g4_force_close_wakes_a_waiting_reader_and_closes_once() {
    let log = Log::default();
    let scope = Scope::new(&CancellationToken::new());
    let mut stream = scope.attach(Recording::new(&log, [Step::Hang]));
    let handle = scope.close_handle().clone();
    let reader = tokio::spawn(async move {
        let end = stream.next().await.is_none();
        (end, stream.is_closed())
    });
    tokio::time::sleep(S).await;
    assert_eq!(handle.close(), ForceClosed::Closed);
    assert_eq!(reader.await.unwrap(), (true, true));
    assert_eq!(handle.cut(), Some(Cut::ForceClosed));
    assert_eq!(log.entries(), ["close", "closed"]);
}

#[tokio::test(start_paused = true)]
async fn g4_force_close_before_attach_closes_at_attach() {
    let log = Log::default();
    let scope = Scope::new(&CancellationToken::new());
    assert_eq!(scope.close_handle().close(), ForceClosed::NothingOpen);
    let mut stream = scope.attach(Recording::new(&log, [Step::Chunk("never")]));
    assert_eq!(log.entries(), ["close", "closed"], "closed at attach");
    assert!(stream.next().await.is_none());
    drop(stream);
    assert_eq!(log.count("close"), 1);
}

#[tokio::test(start_paused = true)]
async fn g6_self_cancel_is_not_cancelled_again() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::SelfCancel)]);
    let session = CancellationToken::new();
    let log = Log::default();
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &session,
        log_sink(&log),
        options(5 * S),
    );
    assert!(matches!(
        turn.exited().await,
        TurnEnd::Cancelled(CancelledBy::Provider)
    ));
    let token = turn.control().token().clone();
    assert_eq!(
        turn.cancel(CancelMode::Immediate),
        CancelIssued::AlreadyEnded
    );
    let settled = settle(turn, S, recorder(&log)).await;
    assert!(!settled.cancelled, "G6: not cancelled again");
    assert!(!token.is_cancelled(), "G6: the token was never cancelled");
    assert!(!session.is_cancelled());
    assert!(matches!(
        settled.end,
        TurnEnd::Cancelled(CancelledBy::Provider)
    ));
    assert_eq!(settled.outcome(), Outcome::Cancelled);
    assert_eq!(log.entries(), ["chunk a", "detach"]);
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g6_an_ended_turn_is_not_cancelled() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"])]);
    let session = CancellationToken::new();
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &session,
        FnSink(|_| Ok(())),
        options(5 * S),
    );
    assert!(matches!(turn.exited().await, TurnEnd::Completed));
    assert!(
        matches!(turn.exited().await, TurnEnd::Completed),
        "exit repeats its end"
    );
    assert_eq!(
        turn.cancel(CancelMode::Immediate),
        CancelIssued::AlreadyEnded
    );
    assert!(!turn.control().token().is_cancelled());
    let settled = settle(turn, S, |_| {}).await;
    assert!(!settled.cancelled);
    assert_eq!(settled.outcome(), Outcome::Completed);
    assert_eq!(provider.stats().close_started, 1);
}

#[tokio::test(start_paused = true)]
async fn g6_a_second_cancel_is_a_no_op() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"])
        .end(ScriptedEnd::IgnoreCancel)
        .chunk_delay(S)]);
    let turn = Turn::spawn(
        Arc::new(provider),
        Request::prompt("hi"),
        &CancellationToken::new(),
        FnSink(|_| Ok(())),
        options(5 * S),
    );
    tokio::time::sleep(S / 2).await;
    assert_eq!(turn.cancel(CancelMode::Immediate), CancelIssued::Cancelled);
    assert_eq!(
        turn.cancel(CancelMode::Immediate),
        CancelIssued::AlreadyCancelled
    );
}

#[tokio::test(start_paused = true)]
async fn g4_hang_ends_with_the_idle_timeout() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &CancellationToken::new(),
        FnSink(|_| Ok(())),
        options(2 * S),
    );
    let started = Instant::now();
    let end = turn.exited().await;
    assert_eq!(started.elapsed(), 2 * S);
    assert_eq!(end.outcome(), Outcome::IdleTimeout);
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g4_fail_ends_failed_and_closed() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Fail)]);
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &CancellationToken::new(),
        FnSink(|_| Ok(())),
        options(2 * S),
    );
    let end = turn.exited().await;
    assert_eq!(end.outcome(), Outcome::Failed);
    assert!(
        matches!(end, TurnEnd::Failed(e) if matches!(e.kind(), StreamErrorKind::Provider { .. }))
    );
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g4_graceful_cancel_lets_the_turn_finish() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b", "c"]).chunk_delay(S)]);
    let log = Log::default();
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &CancellationToken::new(),
        log_sink(&log),
        options(5 * S),
    );
    tokio::time::sleep(S + MS).await;
    assert_eq!(turn.cancel(CancelMode::Graceful), CancelIssued::LetFinish);
    assert!(matches!(turn.exited().await, TurnEnd::Completed));
    assert_eq!(log.entries(), ["chunk a", "chunk b", "chunk c"]);
}

#[tokio::test(start_paused = true)]
async fn g5_detach_happens_once_even_if_settle_is_dropped() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"])
        .end(ScriptedEnd::IgnoreCancel)
        .chunk_delay(S)]);
    let log = Log::default();
    let turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &CancellationToken::new(),
        FnSink(|_| Ok(())),
        options(5 * S),
    );
    tokio::time::sleep(S / 2).await;
    let cut_short = tokio::time::timeout(S / 4, settle(turn, S, recorder(&log))).await;
    assert!(cut_short.is_err());
    assert_eq!(log.entries(), ["detach"]);
    tokio::time::sleep(120 * S).await;
    assert_eq!(provider.stats().close_started, 1);
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g4_dropping_a_turn_detaches_it() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &CancellationToken::new(),
        FnSink(|_| Ok(())),
        options(60 * S),
    );
    tokio::time::sleep(S).await;
    drop(turn);
    tokio::time::sleep(S).await;
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g4_a_closed_sink_cancels_the_turn() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"]).end(ScriptedEnd::Hang)]);
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(4);
    drop(rx);
    let mut turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &CancellationToken::new(),
        tx,
        options(60 * S),
    );
    assert!(matches!(
        turn.exited().await,
        TurnEnd::Cancelled(CancelledBy::SinkClosed)
    ));
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g4_parts_let_a_driver_select_over_exits() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let turn = Turn::spawn(
        Arc::new(provider.clone()),
        Request::prompt("hi"),
        &CancellationToken::new(),
        FnSink(|_| Ok(())),
        options(60 * S),
    );
    let (control, mut exit) = turn.into_parts();
    let deadline = tokio::time::sleep(3 * S);
    tokio::select! {
        _ = &mut exit => panic!("a hung turn does not exit"),
        _ = deadline => {}
    }
    let detached = control.detach();
    assert!(!detached.work_ended);
    assert_eq!(detached.stream, ForceClosed::Closed);
    assert!(matches!(exit.await, TurnEnd::Detached));
    assert_eq!(provider.stats().close_finished, 1);
}
