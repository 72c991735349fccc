//! G4: every provider stream is closed exactly once, on every path, and before
//! the end or the error reaches the consumer.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::{chunk, CloseKind, Log, Recording, Step};
use futures_util::StreamExt;
use settle_stream::{
    close_best_effort, Close, FirstEventTimedOut, Guarded, IdleTimedOut, IdleTimeout,
    StreamErrorKind, StreamEvent, ASYNC_CLOSE_BOUND,
};
use tokio::time::Instant;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

#[tokio::test(start_paused = true)]
async fn g4_normal_end_closes_once_before_the_end_is_seen() {
    let log = Log::default();
    let mut stream = Guarded::new(Recording::new(&log, [Step::Chunk("a"), Step::Chunk("b")]));
    assert_eq!(
        stream.next().await.map(|r| r.unwrap()),
        chunk("a").map(|r| r.unwrap())
    );
    assert_eq!(
        stream.next().await.map(|r| r.unwrap()),
        chunk("b").map(|r| r.unwrap())
    );
    assert!(
        log.entries().is_empty(),
        "closed too early: {:?}",
        log.entries()
    );
    assert!(stream.next().await.is_none());
    log.push("end seen");
    assert!(stream.next().await.is_none(), "fused after the end");
    drop(stream);
    assert_eq!(log.entries(), ["close", "closed", "end seen"]);
}

#[tokio::test(start_paused = true)]
async fn g4_provider_error_closes_once_before_the_error_is_seen() {
    let log = Log::default();
    let inner = Recording::new(&log, [Step::Chunk("a"), Step::Fail, Step::Chunk("never")])
        .close_kind(CloseKind::AsyncOnly(50 * MS));
    let mut stream = Guarded::new(inner);
    assert!(stream.next().await.unwrap().is_ok());
    let started = Instant::now();
    let error = stream.next().await.unwrap().unwrap_err();
    log.push("error seen");
    assert!(
        matches!(error.kind(), StreamErrorKind::Provider { .. }),
        "{error}"
    );
    assert_eq!(
        started.elapsed(),
        50 * MS,
        "the slow close ran before the error"
    );
    assert!(stream.next().await.is_none(), "an error ends the stream");
    drop(stream);
    assert_eq!(log.entries(), ["close", "closed", "error seen"]);
}

#[tokio::test(start_paused = true)]
async fn g4_idle_timeout_fires_after_idle_and_closes_once() {
    let log = Log::default();
    let inner = Recording::new(&log, [Step::Wait(2 * S), Step::Chunk("a"), Step::Hang]);
    let mut stream = Guarded::new(IdleTimeout::new(inner, 5 * S).first_event(10 * S));
    assert!(stream.next().await.unwrap().is_ok());
    let last_event = Instant::now();
    let error = stream.next().await.unwrap().unwrap_err();
    log.push("timeout seen");
    assert_eq!(
        last_event.elapsed(),
        5 * S,
        "fires exactly `idle` after the last event"
    );
    match error.kind() {
        StreamErrorKind::IdleTimeout(IdleTimedOut { idle }) => assert_eq!(*idle, 5 * S),
        other => panic!("expected an idle timeout, got {other}"),
    }
    assert!(error_message_names(5 * S));
    assert!(stream.next().await.is_none());
    drop(stream);
    assert_eq!(log.entries(), ["close", "closed", "timeout seen"]);
}

fn error_message_names(d: Duration) -> bool {
    IdleTimedOut { idle: d }
        .to_string()
        .contains(&format!("{d:?}"))
}

#[tokio::test(start_paused = true)]
async fn g4_first_event_timeout_fires_and_closes_once() {
    let log = Log::default();
    let inner = Recording::new(&log, [Step::Hang]);
    let mut stream = Guarded::new(IdleTimeout::new(inner, 10 * S).first_event(2 * S));
    let started = Instant::now();
    let error = stream.next().await.unwrap().unwrap_err();
    assert_eq!(started.elapsed(), 2 * S);
    match error.kind() {
        StreamErrorKind::FirstEventTimeout(FirstEventTimedOut { first }) => {
            assert_eq!(*first, 2 * S)
        }
        other => panic!("expected a first-event timeout, got {other}"),
    }
    assert!(error.to_string().contains("2s"), "{error}");
    assert_eq!(log.entries(), ["close", "closed"]);
    assert!(stream.next().await.is_none());
    drop(stream);
    assert_eq!(log.count("close"), 1);
}

#[tokio::test(start_paused = true)]
async fn g4_first_event_timeout_defaults_to_the_idle_timeout() {
    let log = Log::default();
    let mut stream = IdleTimeout::new(Recording::new(&log, [Step::Hang]), 3 * S);
    let started = Instant::now();
    let error = stream.next().await.unwrap().unwrap_err();
    assert!(
        matches!(error.kind(), StreamErrorKind::FirstEventTimeout(FirstEventTimedOut { first }) if *first == 3 * S)
    );
    assert_eq!(started.elapsed(), 3 * S);
}

#[tokio::test(start_paused = true)]
async fn g4_keepalives_do_not_count_as_events() {
    let log = Log::default();
    let mut steps = vec![Step::Chunk("a")];
    for _ in 0..10 {
        steps.push(Step::Wait(S));
        steps.push(Step::KeepAlive);
    }
    steps.push(Step::Hang);
    let mut stream = Guarded::new(IdleTimeout::new(Recording::new(&log, steps), 3 * S));
    assert!(stream.next().await.unwrap().is_ok());
    let last_event = Instant::now();
    let mut keepalives = 0;
    let error = loop {
        match stream.next().await.unwrap() {
            Ok(StreamEvent::KeepAlive) => keepalives += 1,
            Ok(other) => panic!("unexpected {other:?}"),
            Err(e) => break e,
        }
    };
    assert!(
        matches!(error.kind(), StreamErrorKind::IdleTimeout(_)),
        "{error}"
    );
    assert_eq!(keepalives, 2, "keepalives pass through until the timeout");
    assert_eq!(
        last_event.elapsed(),
        3 * S,
        "keepalives did not push the deadline"
    );
    assert_eq!(log.count("close"), 1);
}

#[tokio::test(start_paused = true)]
async fn g4_a_steady_stream_never_times_out() {
    // Events every second for a minute under a 3 s idle timeout: the timer,
    // armed once, must be re-armed from the last event whenever it fires
    // early, never fire spuriously.
    let log = Log::default();
    let mut steps = Vec::new();
    for _ in 0..60 {
        steps.push(Step::Wait(S));
        steps.push(Step::Chunk("tick"));
    }
    let mut stream = Guarded::new(IdleTimeout::new(Recording::new(&log, steps), 3 * S));
    let mut n = 0;
    while let Some(item) = stream.next().await {
        item.unwrap();
        n += 1;
    }
    assert_eq!(n, 60);
    assert_eq!(log.entries(), ["close", "closed"]);
}

#[tokio::test(start_paused = true)]
async fn g4_a_zero_duration_disables_the_timeout() {
    let log = Log::default();
    let mut stream = Guarded::new(IdleTimeout::new(
        Recording::new(&log, [Step::Hang]),
        Duration::ZERO,
    ));
    let waited = tokio::time::timeout(3600 * S, stream.next()).await;
    assert!(waited.is_err(), "no timeout fired in an hour");
    assert!(log.entries().is_empty());
    drop(stream);
    assert_eq!(log.entries(), ["close", "closed"]);
}

#[tokio::test(start_paused = true)]
async fn g4_consumer_drop_closes_once_in_place() {
    let log = Log::default();
    let mut stream = Guarded::new(IdleTimeout::new(
        Recording::new(&log, [Step::Chunk("a"), Step::Hang]),
        5 * S,
    ));
    assert!(stream.next().await.unwrap().is_ok());
    drop(stream);
    assert_eq!(log.entries(), ["close", "closed"], "sync close ran in drop");
    tokio::time::sleep(10 * S).await;
    assert_eq!(log.count("close"), 1);
}

#[tokio::test(start_paused = true)]
async fn g4_consumer_drop_hands_an_async_close_to_the_runtime() {
    let log = Log::default();
    let inner = Recording::new(&log, [Step::Chunk("a"), Step::Hang])
        .close_kind(CloseKind::AsyncOnly(100 * MS));
    let mut stream = Guarded::new(IdleTimeout::new(inner, 5 * S));
    assert!(stream.next().await.unwrap().is_ok());
    drop(stream);
    log.push("dropped");
    tokio::time::sleep(S).await;
    assert_eq!(log.entries(), ["dropped", "close", "closed"]);
}

#[test]
fn g4_drop_outside_a_runtime_does_not_panic() {
    let log = Log::default();
    let inner = Recording::new(&log, [Step::Chunk("a")]).close_kind(CloseKind::AsyncOnly(MS));
    drop(Guarded::new(inner));
    // Logged, not panicked; a sync close still runs without a runtime.
    drop(Guarded::new(Recording::new(&log, [Step::Chunk("a")])));
    assert_eq!(log.entries(), ["close", "closed"]);
}

#[tokio::test(start_paused = true)]
async fn g4_outer_close_closes_the_inner_stream_once() {
    let log = Log::default();
    let inner = Recording::new(&log, [Step::Chunk("a"), Step::Hang])
        .close_kind(CloseKind::AsyncOnly(200 * MS));
    let mut stream = Guarded::new(IdleTimeout::new(inner, 5 * S));
    assert!(stream.next().await.unwrap().is_ok());
    let started = Instant::now();
    stream.close().await.unwrap();
    assert_eq!(
        started.elapsed(),
        200 * MS,
        "close waited for the inner async close"
    );
    assert!(stream.is_closed());
    stream.close().await.unwrap();
    stream.close_now().unwrap();
    assert!(stream.next().await.is_none());
    drop(stream);
    assert_eq!(log.entries(), ["close", "closed"]);
}

#[tokio::test(start_paused = true)]
async fn g4_a_close_mid_flight_finishes_after_drop() {
    let log = Log::default();
    let inner = Recording::new(&log, [Step::Hang]).close_kind(CloseKind::AsyncOnly(S));
    let mut stream = Guarded::new(inner);
    // Start the close, give up on it half way, drop the wrapper.
    assert!(tokio::time::timeout(S / 2, stream.close()).await.is_err());
    drop(stream);
    tokio::time::sleep(2 * S).await;
    assert_eq!(log.entries(), ["close", "closed"]);
}

/// A provider whose async close never returns (a server that never
/// acknowledges): the close is given up at its bound, not tried again,
/// and the stream is dropped rather than kept, with the task closing it, for good. The same when the wrapper is
/// dropped with its close handed to the runtime.
#[tokio::test(start_paused = true)]
async fn g4_an_async_close_that_never_returns_is_given_up_at_its_bound_and_the_stream_dropped() {
    let log = Log::default();
    let day = Duration::from_secs(24 * 3600);
    let mut stream =
        Guarded::new(Recording::new(&log, [Step::Hang]).close_kind(CloseKind::AsyncOnly(day)));
    let asked = Instant::now();
    stream.close().await.unwrap();
    let took = asked.elapsed();
    assert!(
        took >= ASYNC_CLOSE_BOUND && took < ASYNC_CLOSE_BOUND + S,
        "the close returned after {took:?}"
    );
    assert_eq!(log.entries(), ["close"]);
    assert_eq!(log.holders(), 1, "the stream is still held");
    drop(Guarded::new(
        Recording::new(&log, [Step::Hang]).close_kind(CloseKind::AsyncOnly(day)),
    ));
    tokio::time::sleep(ASYNC_CLOSE_BOUND + S).await;
    assert_eq!(log.count("close"), 2);
    assert_eq!(log.holders(), 1, "the dropped stream is still held");
}

/// A close that panics or fails is swallowed, and it is the stream's one
/// close: it is not tried again another way (G4, and the `Close` trait's
/// word that the wrappers never close twice).
#[tokio::test(start_paused = true)]
async fn g4_a_panicking_or_failing_close_is_swallowed_and_not_tried_again() {
    for kind in [CloseKind::Panics, CloseKind::AsyncFails] {
        let log = Log::default();
        let mut inner = Recording::new(&log, [Step::Hang]).close_kind(kind);
        close_best_effort(&mut inner).await;
        assert_eq!(log.count("close"), 1, "{kind:?}: {:?}", log.entries());
        let mut stream = Guarded::new(Recording::new(&log, [Step::Fail]).close_kind(kind));
        assert!(stream.next().await.unwrap().is_err());
        assert!(stream.next().await.is_none());
        assert_eq!(log.count("close"), 2, "{kind:?}: {:?}", log.entries());
        let mut stream = Guarded::new(Recording::new(&log, [Step::Hang]).close_kind(kind));
        stream.close().await.unwrap();
        drop(stream);
        assert_eq!(log.count("close"), 3, "{kind:?}: {:?}", log.entries());
    }
}

#[tokio::test(start_paused = true)]
async fn g4_an_idle_timeout_alone_times_out_and_leaves_the_close_to_its_guard() {
    let log = Log::default();
    let mut stream = IdleTimeout::new(Recording::new(&log, [Step::Hang]), 2 * S);
    let error = stream.next().await.unwrap().unwrap_err();
    assert!(
        matches!(error.kind(), StreamErrorKind::FirstEventTimeout(_)),
        "{error}"
    );
    assert!(stream.next().await.is_none(), "a timeout ends the stream");
    assert!(log.entries().is_empty(), "one job: no close of its own");
    stream.close().await.unwrap();
    assert_eq!(
        log.entries(),
        ["close", "closed"],
        "close reaches the inner stream"
    );
}

/// Timeouts too long to add to the clock mean "never" (and do not panic).
#[tokio::test(start_paused = true)]
async fn g4_an_overflowing_timeout_never_fires() {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    for (idle, first) in [
        (Duration::MAX, Duration::MAX),
        (Duration::MAX, CENTURY),
        (CENTURY, Duration::MAX),
        (
            Duration::from_secs(u64::MAX),
            Duration::from_secs(u64::MAX / 2),
        ),
    ] {
        let log = Log::default();
        let steps = [
            Step::Wait(S),
            Step::Chunk("a"),
            Step::Wait(S),
            Step::KeepAlive,
            Step::Hang,
        ];
        let mut stream =
            Guarded::new(IdleTimeout::new(Recording::new(&log, steps), idle).first_event(first));
        assert!(matches!(
            stream.next().await,
            Some(Ok(StreamEvent::Chunk(_)))
        ));
        assert!(matches!(
            stream.next().await,
            Some(Ok(StreamEvent::KeepAlive))
        ));
        let waited = tokio::time::timeout(3600 * S, stream.next()).await;
        assert!(
            waited.is_err(),
            "{idle:?}/{first:?}: no timeout fired in an hour"
        );
        assert!(log.entries().is_empty());
    }
}

/// A work still opening its stream waits on `closed()`: a close before the
/// wait is seen at once, one during it wakes every waiter, and nothing
/// else does.
#[tokio::test(start_paused = true)]
async fn g4_a_force_close_reaches_a_work_that_is_still_opening_before_or_during_its_wait() {
    use settle_stream::Scope;
    let scope = Scope::new();
    let handle = scope.close_handle().clone();
    let waiting = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.closed().await })
    };
    let also = {
        let handle = handle.clone();
        tokio::spawn(async move { handle.closed().await })
    };
    tokio::time::sleep(S).await;
    assert!(
        !waiting.is_finished() && !also.is_finished(),
        "nothing closed it yet"
    );
    scope.token().cancel();
    tokio::time::sleep(S).await;
    assert!(!waiting.is_finished(), "a cancel is not a force close");
    handle.close();
    tokio::time::timeout(S, waiting).await.unwrap().unwrap();
    tokio::time::timeout(S, also).await.unwrap().unwrap();
    // Closed before the wait: seen at once.
    tokio::time::timeout(MS, handle.closed()).await.unwrap();
}
