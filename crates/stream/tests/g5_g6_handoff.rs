//! The handoff of seed 001, as a runtime executes the core's orders through
//! `WorkControl`: attach before produce, cancel once, close from outside,
//! detach with write access revoked first, and one end reported on every
//! path, a panic included (G4, G5, G6).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use common::{Log, Recording, Step};
use futures_util::StreamExt;
use settle_core::{CancelMode, Outcome, TurnError, TurnErrorKind};
use settle_stream::{
    CancelIssued, CancelledBy, Chunk, ChunkSink, Cut, Detached, FnSink, ForceClosed, Guarded,
    Keyed, Provider, ProviderStream, Request, Scope, ScriptStats, ScriptedEnd, ScriptedPanic,
    ScriptedProvider, SinkError, StreamError, TurnOptions, TurnScript, Work, WorkControl, WorkEnd,
    WorkSignal,
};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

const MS: Duration = Duration::from_millis(1);
const S: Duration = Duration::from_secs(1);

use WorkSignal::{StreamAttached, StreamClosed};

/// A sink that records each chunk in the log.
fn log_sink(log: &Log) -> FnSink<impl FnMut(Chunk) -> Result<(), SinkError>> {
    let log = log.clone();
    FnSink(move |chunk: Chunk| {
        log.push(format!("chunk {}", chunk.payload()));
        Ok(())
    })
}

fn quiet_sink() -> FnSink<impl FnMut(Chunk) -> Result<(), SinkError>> {
    FnSink(|_| Ok(()))
}

fn options(idle: Duration) -> TurnOptions {
    TurnOptions {
        idle_timeout: idle,
        first_event_timeout: None,
        ..TurnOptions::default()
    }
}

/// One spawned work as a driver holds it: its control, its signals, the
/// tracker it runs under.
struct Running {
    control: WorkControl,
    signals: mpsc::UnboundedReceiver<(u32, WorkSignal)>,
    tracker: TaskTracker,
}

fn spawn(provider: Arc<dyn Provider>, sink: impl ChunkSink, idle: Duration) -> Running {
    let tracker = TaskTracker::new();
    let (tx, signals) = mpsc::unbounded_channel();
    let control = Work::new(provider, Request::prompt("hi"))
        .options(options(idle))
        .spawn(&tracker, sink, Keyed::new(7, tx));
    Running {
        control,
        signals,
        tracker,
    }
}

impl Running {
    /// Every signal up to and including the end; the end must come.
    async fn until_end(&mut self) -> (Vec<WorkSignal>, WorkEnd) {
        let mut before = Vec::new();
        loop {
            let (key, signal) = self.signals.recv().await.expect("the work reported no end");
            assert_eq!(key, 7, "signals carry the caller's key");
            match signal {
                WorkSignal::Ended(end) => return (before, end),
                other => before.push(other),
            }
        }
    }

    /// Waits for the work's task to be gone, then every signal it left.
    async fn rest(mut self) -> Vec<WorkSignal> {
        self.tracker.close();
        self.tracker.wait().await;
        let mut rest = Vec::new();
        while let Ok((_, signal)) = self.signals.try_recv() {
            rest.push(signal);
        }
        drop(self.control);
        rest
    }
}

/// A provider whose `open` creates its stream and then takes `open_delay`
/// before returning it: a cancel in between must still close that stream.
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
async fn g4_a_cancel_before_the_work_runs_never_opens_a_stream() {
    let provider = ScriptedProvider::new([TurnScript::new(["never"])]);
    let log = Log::default();
    let mut work = spawn(Arc::new(provider.clone()), log_sink(&log), 5 * S);
    assert_eq!(
        work.control.cancel(CancelMode::Immediate),
        CancelIssued::Cancelled
    );
    let (before, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert!(before.is_empty(), "no stream, so no stream signals");
    assert_eq!(provider.stats(), ScriptStats::default(), "nothing opened");
    assert!(log.entries().is_empty());
    assert!(work.rest().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn g4_cancel_before_attach_closes_an_existing_stream_at_attach() {
    let log = Log::default();
    let stream = Recording::new(&log, [Step::Chunk("never")]);
    let scope = Scope::new();
    scope.token().cancel();
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
async fn g4_a_child_scope_is_born_cancelled_under_a_cancelled_parent() {
    let parent = settle_stream::CancellationToken::new();
    parent.cancel();
    let scope = Scope::child_of(&parent);
    assert!(scope.token().is_cancelled());
    let log = Log::default();
    let mut attached = scope.attach(Recording::new(&log, [Step::Chunk("never")]));
    assert!(attached.next().await.is_none());
    assert_eq!(log.entries(), ["close", "closed"]);
}

#[tokio::test(start_paused = true)]
async fn g4_a_cancel_during_the_open_cancels_the_work_and_closes_the_stream() {
    let log = Log::default();
    let provider = SlowOpen {
        log: log.clone(),
        steps: vec![Step::Chunk("never")],
        open_delay: S,
    };
    let mut work = spawn(Arc::new(provider), log_sink(&log), 5 * S);
    tokio::time::sleep(S / 2).await;
    assert_eq!(log.entries(), ["open"]);
    work.control.cancel(CancelMode::Immediate);
    let (before, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert!(before.is_empty());
    assert_eq!(log.entries(), ["open", "close", "closed"]);
}

/// A provider whose dropped open is released only later, elsewhere (a
/// stream opened on another event loop): `release` says when.
struct ReleasedLater {
    log: Log,
    release: Duration,
}

#[async_trait]
impl Provider for ReleasedLater {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        self.log.push("open");
        std::future::pending().await
    }

    async fn open_released(&self) {
        tokio::time::sleep(self.release).await;
        self.log.push("released");
    }
}

/// G5 with an open released elsewhere: a work cancelled while its stream
/// is opening ends once what the open started is released, not before (its
/// session would settle with its source still running); a force close
/// (the settle deadline) waits for nothing.
#[tokio::test(start_paused = true)]
async fn g5_a_work_cancelled_while_opening_ends_once_its_open_is_released() {
    let log = Log::default();
    let provider = ReleasedLater {
        log: log.clone(),
        release: 2 * S,
    };
    let mut work = spawn(Arc::new(provider), log_sink(&log), 5 * S);
    tokio::time::sleep(S / 2).await;
    let cancelled = Instant::now();
    work.control.cancel(CancelMode::Immediate);
    let (_, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert_eq!(
        cancelled.elapsed(),
        2 * S,
        "ended before its open was released"
    );
    assert_eq!(log.entries(), ["open", "released"]);

    let log = Log::default();
    let provider = ReleasedLater {
        log: log.clone(),
        release: 60 * S,
    };
    let mut work = spawn(Arc::new(provider), log_sink(&log), 5 * S);
    tokio::time::sleep(S / 2).await;
    work.control.cancel(CancelMode::Immediate);
    tokio::time::sleep(S).await;
    let closed = Instant::now();
    work.control.close_stream();
    let (_, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert_eq!(closed.elapsed(), Duration::ZERO, "a force close waited");
}

/// A turn past its limits (chunks, or bytes of payload) ends `failed`
/// with a `too_large` error at the chunk past them, which its sink never
/// gets (a runtime's sink stores what it gets): what was delivered is
/// what was kept. Its stream is closed.
#[tokio::test(start_paused = true)]
async fn g7_a_turn_past_its_limits_ends_too_large_before_the_chunk_past_them() {
    // The message names the bound the turn went past, as it was given.
    for (options, kept, says) in [
        (
            TurnOptions::default().max_chunks(Some(2)),
            vec!["chunk a", "chunk bb"],
            "(2 chunks)",
        ),
        (
            TurnOptions::default().max_bytes(Some(3)),
            vec!["chunk a", "chunk bb"],
            "(3 bytes)",
        ),
        (
            TurnOptions::default()
                .max_bytes(Some(2))
                .max_chunks(Some(1)),
            vec!["chunk a"],
            "(1 chunk)",
        ),
    ] {
        let provider = ScriptedProvider::new([TurnScript::new(["a", "bb", "ccc", "dddd"])]);
        let log = Log::default();
        let mut sink = log_sink(&log);
        let end = Work::new(Arc::new(provider.clone()), Request::prompt("hi"))
            .options(options)
            .run(&Scope::new(), &mut sink)
            .await;
        match &end {
            WorkEnd::Failed(error) => {
                assert_eq!(error.kind, TurnErrorKind::TooLarge, "{error:?}");
                assert!(error.message.contains(says), "{error:?}");
            }
            other => panic!("not ended too large: {other:?}"),
        }
        assert_eq!(log.entries(), kept);
        assert_eq!(provider.stats().close_finished, 1, "its stream was closed");
    }
}

/// A provider whose open never returns (a server that accepts the
/// connection and never answers) is bounded by the first-event timeout,
/// counted from the open: the work ends `idle_timeout` and the stream the
/// open made is closed, instead of waiting forever.
#[tokio::test(start_paused = true)]
async fn g5_an_open_that_never_returns_ends_at_the_first_event_timeout() {
    let log = Log::default();
    let provider = SlowOpen {
        log: log.clone(),
        steps: vec![Step::Chunk("never")],
        open_delay: Duration::from_secs(3600),
    };
    let started = Instant::now();
    let mut work = spawn(Arc::new(provider), log_sink(&log), 2 * S);
    let (before, end) = work.until_end().await;
    assert_eq!(started.elapsed(), 2 * S, "ended at the first-event timeout");
    assert_eq!(end.outcome(), Outcome::IdleTimeout, "{end:?}");
    assert!(before.is_empty(), "no stream was attached: {before:?}");
    assert_eq!(log.entries(), ["open", "close", "closed"]);
}

/// An open that gives up at its own headers timeout, when that is the
/// first-event timeout too (both 30 s by default): the first-event timeout
/// is what ends the turn, `idle_timeout`, as the option's doc says of a
/// server that takes the connection and never answers.
#[tokio::test(start_paused = true)]
async fn g5_an_open_timing_out_with_the_first_event_ends_idle_timeout() {
    struct HeadersNever;
    #[async_trait]
    impl Provider for HeadersNever {
        async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
            tokio::time::sleep(2 * S).await;
            Err(settle_stream::StreamErrorKind::HeadersTimeout {
                url: "http://h/v1/chat/completions".into(),
                timeout: 2 * S,
            }
            .into())
        }
    }
    let log = Log::default();
    let mut work = spawn(Arc::new(HeadersNever), log_sink(&log), 2 * S);
    let (_, end) = work.until_end().await;
    assert_eq!(end.outcome(), Outcome::IdleTimeout, "{end:?}");
}

/// The open and the wait for the first event share the first-event
/// timeout: an open that takes most of it leaves the first event the rest.
#[tokio::test(start_paused = true)]
async fn g5_the_first_event_is_due_within_the_first_event_timeout_of_the_open() {
    let log = Log::default();
    let provider = SlowOpen {
        log: log.clone(),
        steps: vec![Step::Wait(S), Step::Chunk("late")],
        open_delay: 3 * S / 2,
    };
    let started = Instant::now();
    let mut work = spawn(Arc::new(provider), log_sink(&log), 2 * S);
    let (_, end) = work.until_end().await;
    assert_eq!(
        started.elapsed(),
        2 * S,
        "the first event was due 2 s after the open"
    );
    assert_eq!(end.outcome(), Outcome::IdleTimeout, "{end:?}");
    assert!(!log.entries().contains(&"chunk late".to_owned()));
    // Said as configured, not as what the open left of it (0.5 s).
    let said = format!("{end:?}");
    assert!(said.contains("within 2s"), "{said}");
}

#[tokio::test(start_paused = true)]
async fn g4_a_stream_closed_while_it_opens_ends_the_work_and_is_closed() {
    // The core's CloseStream for a cancel that raced the attach: the open
    // in flight is abandoned (its stream closed by drop) and the work ends.
    let log = Log::default();
    let provider = SlowOpen {
        log: log.clone(),
        steps: vec![Step::Chunk("never")],
        open_delay: 10 * S,
    };
    let mut work = spawn(Arc::new(provider), log_sink(&log), 60 * S);
    tokio::time::sleep(S).await;
    assert_eq!(work.control.close_stream(), ForceClosed::NothingOpen);
    let started = Instant::now();
    let (before, end) = work.until_end().await;
    assert_eq!(started.elapsed(), Duration::ZERO, "no wait for the open");
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::ForceClose));
    assert!(before.is_empty());
    assert_eq!(log.entries(), ["open", "close", "closed"]);
    assert_eq!(work.control.close_stream(), ForceClosed::NothingOpen);
}

#[tokio::test(start_paused = true)]
async fn g4_force_close_before_attach_closes_at_attach() {
    let log = Log::default();
    let scope = Scope::new();
    assert_eq!(scope.close_handle().close(), ForceClosed::NothingOpen);
    let mut stream = scope.attach(Recording::new(&log, [Step::Chunk("never")]));
    assert_eq!(log.entries(), ["close", "closed"], "closed at attach");
    assert!(stream.next().await.is_none());
    drop(stream);
    assert_eq!(log.count("close"), 1);
}

#[tokio::test(start_paused = true)]
async fn g4_a_cancel_mid_stream_closes_the_stream_before_the_end_is_reported() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b", "c", "d"]).chunk_delay(S)]);
    let log = Log::default();
    let mut work = spawn(Arc::new(provider.clone()), log_sink(&log), 5 * S);
    tokio::time::sleep(2 * S + 500 * MS).await;
    let started = Instant::now();
    assert_eq!(
        work.control.cancel(CancelMode::Immediate),
        CancelIssued::Cancelled
    );
    let (before, end) = work.until_end().await;
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "a sync close unwinds at once"
    );
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert_eq!(end.outcome(), Outcome::Cancelled);
    assert_eq!(log.entries(), ["chunk a", "chunk b"]);
    assert_eq!(
        provider.stats(),
        ScriptStats {
            opened: 1,
            close_started: 1,
            close_finished: 1
        }
    );
    assert!(work.rest().await.is_empty());
}

#[tokio::test(start_paused = true)]
async fn g4_a_slow_close_finishes_before_the_stream_is_reported_closed() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"])
        .chunk_delay(S)
        .end(ScriptedEnd::Hang)
        .close_delay(300 * MS)]);
    let mut work = spawn(Arc::new(provider.clone()), quiet_sink(), 60 * S);
    assert_eq!(work.signals.recv().await.unwrap().1, StreamAttached);
    tokio::time::sleep(5 * S).await;
    let started = Instant::now();
    work.control.cancel(CancelMode::Immediate);
    assert_eq!(work.signals.recv().await.unwrap().1, StreamClosed);
    assert_eq!(
        started.elapsed(),
        300 * MS,
        "reported once the close is done"
    );
    let stats = provider.stats();
    assert_eq!((stats.close_started, stats.close_finished), (1, 1));
    let (_, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    tokio::time::sleep(10 * S).await;
    assert_eq!(provider.stats().close_started, 1);
}

#[tokio::test(start_paused = true)]
async fn g5_a_work_that_ignores_its_cancel_is_detached_with_its_writes_revoked() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b", "c", "d"])
        .chunk_delay(S)
        .end(ScriptedEnd::IgnoreCancel)
        .ignore(60 * S)]);
    let log = Log::default();
    let mut work = spawn(Arc::new(provider.clone()), log_sink(&log), 5 * S);
    tokio::time::sleep(2 * S + 500 * MS).await;
    work.control.cancel(CancelMode::Immediate);
    // The core's settle deadline passes (the core owns it), then it orders
    // the detach.
    tokio::time::sleep(S).await;
    assert!(!work.control.has_ended());
    assert_eq!(provider.stats().close_started, 1, "its close is under way");
    let Running {
        control,
        mut signals,
        tracker,
    } = work;
    let detached = control.detach();
    assert_eq!(
        detached,
        Detached {
            work_ended: false,
            // The work holds its stream in its own close: nothing to force.
            stream: ForceClosed::NothingOpen,
        }
    );
    tracker.close();
    tracker.wait().await;
    assert_eq!(signals.recv().await.unwrap().1, StreamAttached);
    assert!(
        signals.recv().await.is_none(),
        "a detached work reports nothing more"
    );
    // The abandoned close is given up at its bound, before the ignore
    // period's end, and never tried again (G4: one close).
    assert_eq!(provider.stats().close_finished, 0);
    tokio::time::sleep(61 * S).await;
    assert_eq!(
        provider.stats(),
        ScriptStats {
            opened: 1,
            close_started: 1,
            close_finished: 0
        }
    );
    assert_eq!(
        log.entries(),
        ["chunk a", "chunk b"],
        "nothing written after"
    );
}

#[tokio::test(start_paused = true)]
async fn g5_ignore_cancel_genuinely_ignores_the_cancel() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"])
        .chunk_delay(S)
        .end(ScriptedEnd::IgnoreCancel)
        .ignore(10 * S)]);
    let mut work = spawn(Arc::new(provider.clone()), quiet_sink(), 60 * S);
    tokio::time::sleep(1500 * MS).await;
    work.control.cancel(CancelMode::Immediate);
    let started = Instant::now();
    let (_, end) = work.until_end().await;
    assert_eq!(started.elapsed(), 10 * S, "the work ran on for `ignore`");
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
}

#[tokio::test(start_paused = true)]
async fn g5_detach_revokes_the_sink_first_then_closes_the_stream() {
    // The stream hands out a chunk whenever asked; the detach must cut the
    // work off before the next one is delivered.
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b", "c"])
        .chunk_delay(S)
        .end(ScriptedEnd::Hang)]);
    let written = Arc::new(Mutex::new(Vec::new()));
    let sink = {
        let written = written.clone();
        FnSink(move |chunk: Chunk| {
            written.lock().unwrap().push(chunk.into_payload());
            Ok(())
        })
    };
    let work = spawn(Arc::new(provider.clone()), sink, 60 * S);
    tokio::time::sleep(S + 500 * MS).await;
    let Running {
        control,
        mut signals,
        tracker,
    } = work;
    let detached = control.detach();
    assert_eq!(detached.stream, ForceClosed::Closed);
    assert!(!detached.work_ended);
    assert_eq!(provider.stats().close_finished, 1, "closed by the detach");
    tracker.close();
    tracker.wait().await;
    tokio::time::sleep(10 * S).await;
    assert_eq!(*written.lock().unwrap(), ["a"]);
    assert_eq!(signals.recv().await.unwrap().1, StreamAttached);
    assert!(signals.recv().await.is_none(), "no end after a detach");
    assert_eq!(provider.stats().close_started, 1, "closed once");
}

#[tokio::test(start_paused = true)]
async fn g5_dropping_the_control_detaches_the_work() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let Running {
        control,
        mut signals,
        tracker,
    } = spawn(Arc::new(provider.clone()), quiet_sink(), 60 * S);
    tokio::time::sleep(S).await;
    drop(control);
    tracker.close();
    tracker.wait().await;
    assert_eq!(provider.stats().close_finished, 1);
    assert_eq!(signals.recv().await.unwrap().1, StreamAttached);
    assert!(signals.recv().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn g5_a_stuck_work_has_its_stream_force_closed_from_outside() {
    // The work is a thread blocked outside any await point: aborting cannot
    // reach it, only the close handle can.
    let log = Log::default();
    let scope = Scope::new();
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
    let scope = Scope::new();
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
async fn g4_closing_an_open_stream_from_outside_ends_the_work_force_closed() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let mut work = spawn(Arc::new(provider.clone()), quiet_sink(), 60 * S);
    tokio::time::sleep(S).await;
    assert_eq!(work.control.close_stream(), ForceClosed::Closed);
    let (before, end) = work.until_end().await;
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::ForceClose));
    assert_eq!(provider.stats().close_started, 1);
}

#[tokio::test(start_paused = true)]
async fn g6_self_cancel_is_not_cancelled_again() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::SelfCancel)]);
    let log = Log::default();
    let mut work = spawn(Arc::new(provider.clone()), log_sink(&log), 5 * S);
    let (_, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Provider));
    assert_eq!(end.outcome(), Outcome::Cancelled);
    assert_eq!(
        work.control.cancel(CancelMode::Immediate),
        CancelIssued::AlreadyEnded
    );
    assert_eq!(
        work.control.cancel(CancelMode::Graceful),
        CancelIssued::AlreadyEnded
    );
    assert!(
        !work.control.token().is_cancelled(),
        "G6: the token was never cancelled"
    );
    assert_eq!(log.entries(), ["chunk a"]);
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g6_an_ended_work_is_not_cancelled() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"])]);
    let mut work = spawn(Arc::new(provider.clone()), quiet_sink(), 5 * S);
    let (before, end) = work.until_end().await;
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_eq!(end, WorkEnd::Completed);
    assert!(work.control.has_ended());
    assert_eq!(
        work.control.cancel(CancelMode::Immediate),
        CancelIssued::AlreadyEnded
    );
    assert!(!work.control.token().is_cancelled());
    assert_eq!(provider.stats().close_started, 1);
    assert!(work.rest().await.is_empty(), "one end, nothing after");
}

#[tokio::test(start_paused = true)]
async fn g6_a_work_is_cancelled_at_most_once_per_mode() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"])
        .end(ScriptedEnd::IgnoreCancel)
        .chunk_delay(S)]);
    let mut work = spawn(Arc::new(provider), quiet_sink(), 5 * S);
    tokio::time::sleep(S / 2).await;
    let control = &mut work.control;
    assert_eq!(
        control.cancel(CancelMode::Graceful),
        CancelIssued::LetFinish
    );
    assert!(!control.token().is_cancelled(), "graceful only records");
    assert_eq!(
        control.cancel(CancelMode::Graceful),
        CancelIssued::AlreadyCancelled
    );
    assert_eq!(
        control.cancel(CancelMode::Immediate),
        CancelIssued::Cancelled
    );
    assert!(control.token().is_cancelled());
    assert_eq!(
        control.cancel(CancelMode::Immediate),
        CancelIssued::AlreadyCancelled
    );
    assert_eq!(
        control.cancel(CancelMode::Graceful),
        CancelIssued::AlreadyCancelled
    );
    assert_eq!(control.cancelled(), Some(CancelMode::Immediate));
}

#[tokio::test(start_paused = true)]
async fn g4_graceful_cancel_lets_the_turn_finish() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b", "c"]).chunk_delay(S)]);
    let log = Log::default();
    let mut work = spawn(Arc::new(provider.clone()), log_sink(&log), 5 * S);
    tokio::time::sleep(S + MS).await;
    assert_eq!(
        work.control.cancel(CancelMode::Graceful),
        CancelIssued::LetFinish
    );
    let (_, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Completed);
    assert_eq!(log.entries(), ["chunk a", "chunk b", "chunk c"]);
}

#[tokio::test(start_paused = true)]
async fn g4_a_hang_ends_with_the_idle_timeout_and_says_which() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let mut work = spawn(Arc::new(provider.clone()), quiet_sink(), 2 * S);
    let started = Instant::now();
    let (before, end) = work.until_end().await;
    assert_eq!(started.elapsed(), 2 * S);
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_eq!(end.outcome(), Outcome::IdleTimeout);
    let error = end.error().unwrap();
    assert_eq!(error.kind, TurnErrorKind::Timeout);
    assert!(error.message.contains("(idle timeout)"), "{error}");
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g4_a_failure_ends_failed_with_its_reason_and_closed() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Fail)]);
    let mut work = spawn(Arc::new(provider.clone()), quiet_sink(), 2 * S);
    let (_, end) = work.until_end().await;
    assert_eq!(end.outcome(), Outcome::Failed);
    let error = end.error().unwrap();
    assert_eq!(error.kind, TurnErrorKind::Provider);
    assert!(
        error.message.contains("the scripted turn fails here"),
        "{error}"
    );
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g4_an_exhausted_script_fails_without_a_stream() {
    let provider = ScriptedProvider::new([]);
    let mut work = spawn(Arc::new(provider), quiet_sink(), 2 * S);
    let (before, end) = work.until_end().await;
    assert!(before.is_empty());
    assert_eq!(end.error().unwrap().kind, TurnErrorKind::Provider);
}

#[tokio::test(start_paused = true)]
async fn g4_a_closed_sink_cancels_the_work() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"]).end(ScriptedEnd::Hang)]);
    let (tx, rx) = mpsc::channel::<Chunk>(4);
    drop(rx);
    let mut work = spawn(Arc::new(provider.clone()), tx, 60 * S);
    let (before, end) = work.until_end().await;
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::SinkClosed));
    assert_eq!(provider.stats().close_finished, 1);
}

#[tokio::test(start_paused = true)]
async fn g7_a_sink_that_fails_ends_the_work_failed_with_its_error() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"]).end(ScriptedEnd::Hang)]);
    let refused = TurnError::new(TurnErrorKind::Store, "the disk is full");
    let sink = {
        let refused = refused.clone();
        FnSink(move |_| Err(SinkError::Failed(refused.clone())))
    };
    let mut work = spawn(Arc::new(provider.clone()), sink, 60 * S);
    let (before, end) = work.until_end().await;
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_eq!(end, WorkEnd::Failed(refused));
    assert_eq!(provider.stats().close_finished, 1);
}

/// A sink that is not ready until its gate opens (a turn row being written).
struct Gated {
    gate: Option<oneshot::Receiver<Result<(), SinkError>>>,
    log: Log,
}

#[async_trait]
impl ChunkSink for Gated {
    async fn begin(&mut self) -> Result<(), SinkError> {
        self.log.push("begin");
        match self.gate.take() {
            Some(gate) => gate.await.unwrap_or(Err(SinkError::Closed)),
            None => Ok(()),
        }
    }

    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError> {
        self.log.push(format!("chunk {}", chunk.payload()));
        Ok(())
    }
}

#[tokio::test(start_paused = true)]
async fn g7_the_stream_opens_only_once_the_sink_is_ready() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"])]);
    let log = Log::default();
    let (open, gate) = oneshot::channel();
    let sink = Gated {
        gate: Some(gate),
        log: log.clone(),
    };
    let mut work = spawn(Arc::new(provider.clone()), sink, 60 * S);
    tokio::time::sleep(S).await;
    assert_eq!(provider.stats().opened, 0, "not before the sink is ready");
    open.send(Ok(())).unwrap();
    let (_, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Completed);
    assert_eq!(log.entries(), ["begin", "chunk a"]);

    // A sink that cannot begin ends the work before anything is opened.
    let provider = ScriptedProvider::new([TurnScript::new(["a"])]);
    let (open, gate) = oneshot::channel();
    let refused = TurnError::new(TurnErrorKind::Store, "could not record the turn's start");
    open.send(Err(SinkError::Failed(refused.clone()))).unwrap();
    let sink = Gated {
        gate: Some(gate),
        log: log.clone(),
    };
    let mut work = spawn(Arc::new(provider.clone()), sink, 60 * S);
    let (before, end) = work.until_end().await;
    assert!(before.is_empty());
    assert_eq!(end, WorkEnd::Failed(refused));
    assert_eq!(provider.stats().opened, 0);

    // A cancel while the sink is getting ready: nothing is opened.
    let provider = ScriptedProvider::new([TurnScript::new(["a"])]);
    let (_open, gate) = oneshot::channel();
    let sink = Gated {
        gate: Some(gate),
        log: log.clone(),
    };
    let mut work = spawn(Arc::new(provider.clone()), sink, 60 * S);
    tokio::time::sleep(S).await;
    work.control.cancel(CancelMode::Immediate);
    let (_, end) = work.until_end().await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert_eq!(provider.stats().opened, 0);
}

fn assert_panicked(end: &WorkEnd, says: &str) {
    let WorkEnd::Panicked(error) = end else {
        panic!("expected a panicked end, got {end:?}");
    };
    assert_eq!(error.kind, TurnErrorKind::Panic);
    assert!(error.message.contains(says), "{error}");
    assert_eq!(end.outcome(), Outcome::Failed);
}

#[tokio::test(start_paused = true)]
async fn g4_a_provider_that_panics_in_open_ends_the_work_failed() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).panic(ScriptedPanic::InOpen)]);
    let mut work = spawn(Arc::new(provider.clone()), quiet_sink(), 60 * S);
    let (before, end) = work.until_end().await;
    assert!(before.is_empty(), "no stream was opened");
    assert_panicked(&end, "the scripted provider panics in open");
    assert!(work.control.has_ended());
    assert!(work.rest().await.is_empty(), "one end");
}

#[tokio::test(start_paused = true)]
async fn g4_a_stream_that_panics_mid_stream_ends_the_work_failed_and_is_closed() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"])
        .chunk_delay(S)
        .panic(ScriptedPanic::MidStream)]);
    let log = Log::default();
    let mut work = spawn(Arc::new(provider.clone()), log_sink(&log), 60 * S);
    let (before, end) = work.until_end().await;
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_panicked(&end, "the scripted stream panics mid-stream");
    assert_eq!(log.entries(), ["chunk a", "chunk b"]);
    assert_eq!(
        provider.stats(),
        ScriptStats {
            opened: 1,
            close_started: 1,
            close_finished: 1
        },
        "G4: the panicking stream was closed once"
    );
    assert!(work.rest().await.is_empty(), "one end");
}

#[tokio::test(start_paused = true)]
async fn g4_a_sink_that_panics_ends_the_work_failed_and_closes_the_stream() {
    let provider = ScriptedProvider::new([TurnScript::new(["a", "b"]).end(ScriptedEnd::Hang)]);
    let sink = FnSink(|chunk: Chunk| -> Result<(), SinkError> {
        panic!("the sink choked on {}", chunk.payload())
    });
    let mut work = spawn(Arc::new(provider.clone()), sink, 60 * S);
    let (before, end) = work.until_end().await;
    assert_eq!(before, [StreamAttached, StreamClosed]);
    assert_panicked(&end, "the sink choked on a");
    assert_eq!(provider.stats().close_finished, 1);
}

#[test]
fn g4_a_work_dropped_with_its_runtime_still_reports_its_end_once() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let (control, mut signals) = runtime.block_on(async {
        let work = spawn(Arc::new(provider.clone()), quiet_sink(), 60 * S);
        tokio::time::sleep(S).await;
        (work.control, work.signals)
    });
    drop(runtime);
    let mut seen = Vec::new();
    while let Ok((_, signal)) = signals.try_recv() {
        seen.push(signal);
    }
    assert_eq!(
        seen,
        [
            StreamAttached,
            StreamClosed,
            WorkSignal::Ended(WorkEnd::Abandoned)
        ]
    );
    assert_eq!(WorkEnd::Abandoned.outcome(), Outcome::Detached);
    assert_eq!(provider.stats().close_finished, 1, "closed by drop");
    drop(control);
}

/// A stream whose second poll blocks its thread until released, then
/// yields a chunk: a work stuck outside any await point.
struct Blocking {
    polls: usize,
    entered: Option<oneshot::Sender<()>>,
    release: std::sync::mpsc::Receiver<()>,
    log: Log,
}

impl futures_util::Stream for Blocking {
    type Item = Result<settle_stream::StreamEvent, StreamError>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        self.polls += 1;
        if self.polls == 2 {
            if let Some(entered) = self.entered.take() {
                let _ = entered.send(());
            }
            self.release.recv().unwrap();
        }
        let chunk = if self.polls == 1 { "a" } else { "b" };
        std::task::Poll::Ready(Some(Ok(settle_stream::StreamEvent::Chunk(Chunk::text(
            chunk,
        )))))
    }
}

#[async_trait]
impl settle_stream::Close for Blocking {
    fn close_now(&mut self) -> Result<(), settle_stream::CloseError> {
        self.log.push("close");
        Ok(())
    }
}

struct OpensBlocking(Mutex<Option<Blocking>>);

#[async_trait]
impl Provider for OpensBlocking {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        Ok(Box::new(self.0.lock().unwrap().take().unwrap()))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g5_a_stuck_work_detached_writes_nothing_when_it_wakes() {
    let log = Log::default();
    let (entered_tx, entered) = oneshot::channel();
    let (release, blocked) = std::sync::mpsc::channel();
    let provider = OpensBlocking(Mutex::new(Some(Blocking {
        polls: 0,
        entered: Some(entered_tx),
        release: blocked,
        log: log.clone(),
    })));
    let (tx, mut written) = mpsc::unbounded_channel::<Chunk>();
    let Running {
        control,
        mut signals,
        tracker,
    } = spawn(Arc::new(provider), tx, 60 * S);
    assert_eq!(written.recv().await.unwrap(), Chunk::text("a"));
    entered.await.unwrap();
    // The work's thread is inside its stream's poll: nothing can interrupt
    // it, but its write access is revoked before it returns.
    let detached = control.detach();
    assert_eq!(detached.stream, ForceClosed::Requested);
    release.send(()).unwrap();
    tracker.close();
    tracker.wait().await;
    assert!(written.recv().await.is_none(), "the late chunk was refused");
    assert_eq!(log.count("close"), 1, "closed once, by the work itself");
    assert_eq!(signals.recv().await.unwrap().1, StreamAttached);
    assert!(
        signals.recv().await.is_none(),
        "a detached work reports nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn g4_a_work_run_inline_reads_to_its_end_and_honours_its_scope() {
    let provider = Arc::new(ScriptedProvider::new([
        TurnScript::new(["a", "b"]),
        TurnScript::new(["never"]),
    ]));
    let log = Log::default();
    let mut sink = log_sink(&log);
    let end = Work::new(provider.clone(), Request::prompt("hi"))
        .run(&Scope::new(), &mut sink)
        .await;
    assert_eq!(end, WorkEnd::Completed);
    assert_eq!(log.entries(), ["chunk a", "chunk b"]);
    assert_eq!(provider.stats().close_finished, 1);

    let cancelled = Scope::new();
    cancelled.token().cancel();
    let end = Work::new(provider.clone(), Request::prompt("hi"))
        .run(&cancelled, &mut sink)
        .await;
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert_eq!(
        provider.stats().opened,
        1,
        "a cancelled scope opens nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn g4_a_work_with_timeouts_too_long_for_the_clock_never_times_out() {
    let provider = ScriptedProvider::new([TurnScript::new(["a"]).end(ScriptedEnd::Hang)]);
    let tracker = TaskTracker::new();
    let (tx, mut signals) = mpsc::unbounded_channel();
    let control = Work::new(Arc::new(provider.clone()), Request::prompt("hi"))
        .options(TurnOptions {
            idle_timeout: Duration::MAX,
            first_event_timeout: Some(Duration::MAX),
            ..TurnOptions::default()
        })
        .spawn(&tracker, quiet_sink(), Keyed::new((), tx));
    assert_eq!(signals.recv().await.unwrap().1, StreamAttached);
    let waited = tokio::time::timeout(24 * 3600 * S, signals.recv()).await;
    assert!(waited.is_err(), "nothing ended the work in a day");
    assert!(!control.has_ended());
    assert_eq!(control.close_stream(), ForceClosed::Closed);
    assert_eq!(signals.recv().await.unwrap().1, StreamClosed);
    assert_eq!(
        signals.recv().await.unwrap().1,
        WorkSignal::Ended(WorkEnd::Cancelled(CancelledBy::ForceClose))
    );
}
