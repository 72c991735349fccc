//! Retries of a turn's opening, on the paused clock: a 429 or 5xx before
//! the stream exists is tried again with bounded exponential backoff (or the
//! server's `Retry-After`), each retry signalled; nothing else is retried,
//! and nothing at all once a chunk was delivered (G7); a fallback provider
//! takes over once the retries are spent; a cancel during the wait ends the
//! turn at once.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use settle_core::{CancelMode, Outcome};
use settle_stream::{
    CancelledBy, Chunk, FnSink, Keyed, Provider, ProviderStream, Request, RetryPolicy, ScriptedEnd,
    ScriptedProvider, SinkError, StreamError, StreamErrorKind, TurnOptions, TurnScript, Work,
    WorkEnd, WorkSignal,
};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

const S: Duration = Duration::from_secs(1);

/// Answers each open with the next status in line (then opens `then`).
struct Flaky {
    statuses: Mutex<VecDeque<(u16, Option<Duration>)>>,
    then: ScriptedProvider,
    opens: Mutex<u32>,
}

impl Flaky {
    fn new(statuses: &[(u16, Option<Duration>)], then: ScriptedProvider) -> Arc<Self> {
        Arc::new(Flaky {
            statuses: Mutex::new(statuses.iter().copied().collect()),
            then,
            opens: Mutex::new(0),
        })
    }

    fn opens(&self) -> u32 {
        *self.opens.lock().unwrap()
    }
}

#[async_trait]
impl Provider for Flaky {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        *self.opens.lock().unwrap() += 1;
        let next = self.statuses.lock().unwrap().pop_front();
        match next {
            Some((status, retry_after)) => Err(StreamErrorKind::Status {
                url: "http://model/v1/chat/completions".into(),
                status,
                body: String::new(),
                retry_after,
            }
            .into()),
            None => self.then.open(request).await,
        }
    }
}

struct Run {
    end: WorkEnd,
    /// Each retry: its attempt, its wait, whether it fell back, and when.
    retries: Vec<(u32, Duration, bool, Duration)>,
    chunks: Vec<String>,
}

async fn run(provider: Arc<dyn Provider>, retry: RetryPolicy) -> Run {
    run_with(provider, TurnOptions::default().retry(retry)).await
}

async fn run_with(provider: Arc<dyn Provider>, options: TurnOptions) -> Run {
    let began = Instant::now();
    let tracker = TaskTracker::new();
    let (tx, mut signals) = mpsc::unbounded_channel();
    let chunks = Arc::new(Mutex::new(Vec::new()));
    let seen = chunks.clone();
    let sink = FnSink(move |chunk: Chunk| -> Result<(), SinkError> {
        seen.lock().unwrap().push(chunk.payload().to_owned());
        Ok(())
    });
    let _control = Work::new(provider, Request::prompt("hi"))
        .options(options)
        .spawn(&tracker, sink, Keyed::new((), tx));
    let mut retries = Vec::new();
    loop {
        match signals.recv().await.unwrap().1 {
            WorkSignal::Retrying {
                attempt,
                delay,
                fallback,
                ..
            } => retries.push((attempt, delay, fallback, began.elapsed())),
            WorkSignal::Ended(end) => {
                let chunks = chunks.lock().unwrap().clone();
                return Run {
                    end,
                    retries,
                    chunks,
                };
            }
            _ => {}
        }
    }
}

fn policy(retries: u32) -> RetryPolicy {
    RetryPolicy::default().retries(retries).backoff(S, 10 * S)
}

fn script() -> ScriptedProvider {
    ScriptedProvider::new([TurnScript::new(["hello"])])
}

#[tokio::test(start_paused = true)]
async fn a_429_and_5xx_before_the_first_chunk_are_retried_with_exponential_backoff() {
    let flaky = Flaky::new(&[(503, None), (502, None), (429, None)], script());
    let run = run(flaky.clone(), policy(3)).await;
    assert_eq!(run.end, WorkEnd::Completed);
    assert_eq!(run.chunks, ["hello"]);
    assert_eq!(flaky.opens(), 4);
    // Each retry waited its backoff, doubling: 1 s, 2 s, 4 s.
    let waits: Vec<_> = run.retries.iter().map(|r| (r.0, r.1)).collect();
    assert_eq!(waits, [(1, S), (2, 2 * S), (3, 4 * S)]);
    assert_eq!(
        run.retries[2].3,
        3 * S,
        "the third retry was announced after 1 + 2 s"
    );
}

#[tokio::test(start_paused = true)]
async fn a_429_is_retried_after_the_servers_retry_after() {
    let flaky = Flaky::new(&[(429, Some(7 * S))], script());
    let began = Instant::now();
    let first = run(flaky.clone(), policy(1)).await;
    assert_eq!(first.end, WorkEnd::Completed);
    assert_eq!(first.retries[0].1, 7 * S);
    assert!(began.elapsed() >= 7 * S);
    // One longer than the bound is not waited for: the turn fails with it.
    let flaky = Flaky::new(&[(429, Some(60 * S))], script());
    let second = run(flaky.clone(), policy(3)).await;
    assert_eq!(second.end.outcome(), Outcome::Failed);
    assert!(second.retries.is_empty());
    assert_eq!(flaky.opens(), 1);
}

#[tokio::test(start_paused = true)]
async fn spent_retries_fail_the_turn_with_the_last_answer() {
    let flaky = Flaky::new(&[(500, None), (500, None), (500, None)], script());
    let run = run(flaky.clone(), policy(2)).await;
    assert_eq!(flaky.opens(), 3);
    assert_eq!(run.retries.len(), 2);
    let error = run.end.error().unwrap();
    assert!(error.message.contains("HTTP 500"), "{}", error.message);
}

/// The opening, its retries and the wait for the first event share the
/// first-event deadline. A refusal whose wait would run past it ends the
/// turn with that refusal at once: the server's answer, not "no first
/// event", and not at the deadline (the retries hid the server's 503 behind
/// an `idle_timeout`).
#[tokio::test(start_paused = true)]
async fn a_retry_that_would_wait_past_the_first_event_deadline_fails_with_the_refusal() {
    let busy = [(503, None); 6];
    let flaky = Flaky::new(&busy, script());
    let options = TurnOptions::default()
        .retry(policy(6))
        .first_event_timeout(5 * S);
    let began = Instant::now();
    let run = run_with(flaky.clone(), options).await;
    // Refused at 0 s, 1 s and 3 s; the next wait (4 s) would end past 5 s.
    assert_eq!(flaky.opens(), 3);
    assert_eq!(began.elapsed(), 3 * S);
    assert_eq!(run.end.outcome(), Outcome::Failed);
    let error = run.end.error().unwrap();
    assert!(error.message.contains("HTTP 503"), "{}", error.message);
    // The server's own Retry-After, past the deadline: the same, at once.
    let flaky = Flaky::new(&[(429, Some(8 * S))], script());
    let options = TurnOptions::default()
        .retry(policy(3))
        .first_event_timeout(5 * S);
    let run = run_with(flaky.clone(), options).await;
    assert_eq!(flaky.opens(), 1);
    assert!(run.end.error().unwrap().message.contains("HTTP 429"));
}

#[tokio::test(start_paused = true)]
async fn an_error_that_cannot_heal_is_not_retried() {
    let flaky = Flaky::new(&[(404, None)], script());
    let run = run(flaky.clone(), policy(5)).await;
    assert_eq!(run.end.outcome(), Outcome::Failed);
    assert_eq!(flaky.opens(), 1);
    assert!(run.retries.is_empty());
}

#[tokio::test(start_paused = true)]
async fn g7_a_stream_that_fails_after_a_delivered_chunk_is_never_retried() {
    let failing = ScriptedProvider::new([
        TurnScript::new(["persisted"]).end(ScriptedEnd::Fail),
        TurnScript::new(["a second reply"]),
    ]);
    let run = run(Arc::new(failing.clone()), policy(5)).await;
    assert_eq!(run.end.outcome(), Outcome::Failed);
    assert_eq!(run.chunks, ["persisted"]);
    assert!(run.retries.is_empty());
    assert_eq!(failing.stats().opened, 1, "the stream was opened once");
}

#[tokio::test(start_paused = true)]
async fn the_fallback_provider_is_opened_once_the_retries_are_spent() {
    let flaky = Flaky::new(&[(503, None), (503, None)], script());
    let fallback = ScriptedProvider::new([TurnScript::new(["from the fallback"])]);
    let run = run(
        flaky.clone(),
        policy(1).fallback(Arc::new(fallback.clone())),
    )
    .await;
    assert_eq!(run.end, WorkEnd::Completed);
    assert_eq!(run.chunks, ["from the fallback"]);
    assert_eq!(flaky.opens(), 2);
    assert_eq!(fallback.stats().opened, 1);
    let last = run.retries.last().unwrap();
    assert!(last.2, "the last retry names the fallback");
}

#[tokio::test(start_paused = true)]
async fn a_cancel_during_the_backoff_ends_the_turn_at_once() {
    let flaky = Flaky::new(&[(503, None)], script());
    let tracker = TaskTracker::new();
    let (tx, mut signals) = mpsc::unbounded_channel();
    let sink = FnSink(|_: Chunk| -> Result<(), SinkError> { Ok(()) });
    let mut control = Work::new(flaky.clone(), Request::prompt("hi"))
        .options(
            TurnOptions::default()
                .retry(policy(3).backoff(60 * S, 60 * S))
                .first_event_timeout(120 * S),
        )
        .spawn(&tracker, sink, Keyed::new((), tx));
    assert!(matches!(
        signals.recv().await.unwrap().1,
        WorkSignal::Retrying { .. }
    ));
    let cancelled = Instant::now();
    let _ = control.cancel(CancelMode::Immediate);
    let end = loop {
        if let WorkSignal::Ended(end) = signals.recv().await.unwrap().1 {
            break end;
        }
    };
    assert_eq!(end, WorkEnd::Cancelled(CancelledBy::Request));
    assert!(cancelled.elapsed() < S, "the backoff was not waited out");
    assert_eq!(flaky.opens(), 1);
}
