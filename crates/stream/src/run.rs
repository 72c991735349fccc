//! The body of a work: open the provider's stream inside the work's scope,
//! read it to its end, and deliver each chunk to the sink.

use std::time::Duration;

use futures_util::StreamExt;
use settle_core::TurnError;

use crate::signal::{CancelledBy, WorkEnd};
use crate::sink::{ChunkSink, SinkError};
use crate::{
    Chunk, Cut, FirstEventTimedOut, IdleTimeout, Provider, ProviderStream, Request, RetryPolicy,
    Scope, StreamError, StreamErrorKind, StreamEvent,
};

/// The default idle timeout of a turn's stream: the one default of the
/// stream crate, the runtime's [`Config`] and the command line alike.
///
/// Thirty seconds of silence (no chunk and no keepalive) is a hung stream
/// for any server that streams; a model that thinks longer before its first
/// token gets a longer [`first_event_timeout`](TurnOptions::first_event_timeout).
///
/// [`Config`]: https://docs.rs/settle-runtime/latest/settle_runtime/struct.Config.html
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The timeouts and retries of one turn's stream. The settle deadline is not
/// here: it is the lifecycle core's, which detaches a work that does not
/// unwind in time.
#[derive(Debug, Clone)]
pub struct TurnOptions {
    /// No event for this long ends the turn with `idle_timeout`; zero
    /// disables, and so does a duration too long for the clock.
    pub idle_timeout: Duration,
    /// No first event within this of the stream's open ends the turn with
    /// `idle_timeout`: the open (a server that takes the connection and never
    /// answers), its retries and the wait for the first event count alike.
    /// `None` means the idle timeout, zero disables.
    pub first_event_timeout: Option<Duration>,
    /// How opening the stream is retried before its first chunk.
    pub retry: RetryPolicy,
    /// The most chunks the turn may stream; the chunk past it is not
    /// delivered (not stored, in a runtime) and ends the turn `failed`
    /// with a `too_large` error. `None`: no limit.
    pub max_chunks: Option<usize>,
    /// The most bytes of chunk payloads (a text chunk's text, another's
    /// JSON) the turn may stream, bounded as `max_chunks` is.
    pub max_bytes: Option<usize>,
}

impl Default for TurnOptions {
    fn default() -> Self {
        TurnOptions {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            first_event_timeout: None,
            retry: RetryPolicy::default(),
            max_chunks: None,
            max_bytes: None,
        }
    }
}

impl TurnOptions {
    /// Sets the idle timeout (zero disables).
    pub fn idle_timeout(mut self, idle: Duration) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// Sets the first-event timeout (zero disables).
    pub fn first_event_timeout(mut self, first: Duration) -> Self {
        self.first_event_timeout = Some(first);
        self
    }

    /// Sets how opening the stream is retried.
    pub fn retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Sets the most chunks the turn may stream (`None`: no limit).
    pub fn max_chunks(mut self, chunks: Option<usize>) -> Self {
        self.max_chunks = chunks;
        self
    }

    /// Sets the most bytes of chunks the turn may stream (`None`: no limit).
    pub fn max_bytes(mut self, bytes: Option<usize>) -> Self {
        self.max_bytes = bytes;
        self
    }
}

/// What the body tells its work as it goes.
pub(crate) trait Progress {
    /// The stream is open and attached to the scope.
    fn attached(&mut self);
    /// The stream is closed.
    fn closed(&mut self);
    /// Opening failed with `error` and is tried again after `delay`
    /// (`attempt` from 1; `fallback` when the fallback provider is next).
    fn retrying(&mut self, attempt: u32, delay: Duration, fallback: bool, error: TurnError);
    /// A usage report counting `tokens` was delivered (persisted).
    fn usage(&mut self, tokens: u64);
}

impl Progress for () {
    fn attached(&mut self) {}
    fn closed(&mut self) {}
    fn retrying(&mut self, _: u32, _: Duration, _: bool, _: TurnError) {}
    fn usage(&mut self, _: u64) {}
}

/// The body of a work; see [`Work::run`](crate::Work::run).
pub(crate) async fn run<K, P>(
    provider: &dyn Provider,
    request: &Request,
    scope: &Scope,
    sink: &mut K,
    options: TurnOptions,
    progress: &mut P,
) -> WorkEnd
where
    K: ChunkSink + ?Sized,
    P: Progress + ?Sized,
{
    let token = scope.token();
    let close = scope.close_handle();
    // Biased: a scope cancelled or closed before the work began never asks
    // its sink or its provider for anything.
    let begun = tokio::select! {
        biased;
        () = token.cancelled() => return WorkEnd::Cancelled(CancelledBy::Request),
        () = close.closed() => return WorkEnd::Cancelled(CancelledBy::ForceClose),
        begun = sink.begin() => begun,
    };
    if let Err(error) = begun {
        return sink_end(error);
    }
    // The first event is due within the first-event timeout of the open:
    // the open (a server that takes the connection and never answers), its
    // retries and the wait for the first event share that one deadline.
    let first = options.first_event_timeout.unwrap_or(options.idle_timeout);
    let due = (!first.is_zero())
        .then(|| tokio::time::Instant::now().checked_add(first))
        .flatten();
    // The deadline before the open: an open that gives up at its own
    // timeout in the same tick (a headers timeout equal to it, both 30 s by
    // default) ends the turn as the first-event timeout says.
    enum Opening {
        Opened(Result<ProviderStream, StreamError>),
        Cancelled(CancelledBy),
        TimedOut,
    }
    let opening = tokio::select! {
        biased;
        () = token.cancelled() => Opening::Cancelled(CancelledBy::Request),
        () = close.closed() => Opening::Cancelled(CancelledBy::ForceClose),
        () = until(due) => Opening::TimedOut,
        opened = open(provider, request, &options.retry, due, progress) => Opening::Opened(opened),
    };
    // The open dropped (above): what it had started is released before the
    // work ends, so its session settles only then (G5), or at the settle
    // deadline; after a force close (that deadline) nobody waits any more.
    let stream = match opening {
        Opening::Opened(Ok(stream)) => stream,
        Opening::Opened(Err(error)) => return WorkEnd::from_error(&error),
        Opening::Cancelled(by) => {
            if by == CancelledBy::Request {
                tokio::select! {
                    biased;
                    () = close.closed() => {}
                    () = provider.open_released() => {}
                }
            }
            return WorkEnd::Cancelled(by);
        }
        Opening::TimedOut => {
            let _ = tokio::time::timeout(scope.close_bound(), provider.open_released()).await;
            return WorkEnd::from_error(&FirstEventTimedOut { first }.into());
        }
    };
    // What is left of it for the first event (never zero, which disables).
    let left = due.map_or(first, |due| {
        due.saturating_duration_since(tokio::time::Instant::now())
            .max(Duration::from_nanos(1))
    });
    let mut stream = scope.attach(IdleTimeout::new(stream, options.idle_timeout).first_event(left));
    progress.attached();
    let mut taken = Taken::default();
    // The provider said the reply is done, whole or cut: a cancel from now
    // on (a budget its usage report exhausted) cuts nothing of it.
    let mut finished: Option<Option<crate::Truncation>> = None;
    let end = loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Chunk(chunk))) => {
                if let Some(over) = taken.take(&chunk, &options) {
                    break WorkEnd::Failed(over);
                }
                let usage = (chunk.kind() == settle_core::ChunkKind::Usage)
                    .then(|| crate::usage_tokens(&chunk.to_json()));
                let delivered = tokio::select! {
                    biased;
                    () = token.cancelled() => Err(WorkEnd::Cancelled(CancelledBy::Request)),
                    sent = sink.chunk(chunk) => sent.map_err(sink_end),
                };
                if let Err(end) = delivered {
                    break end;
                }
                // Counted once the sink has it (persisted, in a runtime).
                if let Some(tokens) = usage {
                    progress.usage(tokens);
                }
            }
            Some(Ok(StreamEvent::KeepAlive)) => {}
            Some(Ok(StreamEvent::Finished(cut))) => finished = Some(cut),
            // Timed against what the open left of it, said as configured.
            Some(Err(error)) if matches!(error.kind(), StreamErrorKind::FirstEventTimeout(_)) => {
                break WorkEnd::from_error(&FirstEventTimedOut { first }.into())
            }
            Some(Err(error)) => break WorkEnd::from_error(&error),
            None => {
                break match close.cut() {
                    None => WorkEnd::Completed,
                    Some(Cut::Cancelled) => WorkEnd::Cancelled(CancelledBy::Request),
                    Some(Cut::ForceClosed) => WorkEnd::Cancelled(CancelledBy::ForceClose),
                }
            }
        }
    };
    // Cancelled, or gone quiet (a server that never sends `[DONE]` nor
    // closes), after the provider said the reply is done: it ends as that
    // said, whole or cut.
    let end = match (end, finished) {
        (WorkEnd::Cancelled(_) | WorkEnd::IdleTimeout(_), Some(None)) => WorkEnd::Completed,
        (WorkEnd::Cancelled(_) | WorkEnd::IdleTimeout(_), Some(Some(cut))) => {
            WorkEnd::from_error(&StreamErrorKind::Truncated(cut).into())
        }
        (end, _) => end,
    };
    // Already closed at an end or an error; not when the sink stopped us.
    // Driven in place: no boxed future for a close with nothing to wait for.
    std::future::poll_fn(|cx| std::pin::Pin::new(&mut stream).poll_close(cx)).await;
    progress.closed();
    end
}

/// Opens the stream, retrying as `retry` says: only here, before the stream
/// exists, so never after a chunk was acknowledged (G7). The caller's select
/// cancels it (the wait included) on a cancel or a force close, and at the
/// first-event deadline `due`; a refusal whose wait would end past `due`
/// fails the turn with that refusal at once, not with the deadline's "no
/// first event" later.
async fn open<P>(
    provider: &dyn Provider,
    request: &Request,
    retry: &RetryPolicy,
    due: Option<tokio::time::Instant>,
    progress: &mut P,
) -> Result<ProviderStream, StreamError>
where
    P: Progress + ?Sized,
{
    let mut attempt = 0;
    loop {
        let error = match provider.open_by(request, due).await {
            Ok(stream) => return Ok(stream),
            Err(error) => error,
        };
        let Some(asked) = RetryPolicy::retryable(&error) else {
            return Err(error);
        };
        let past_due = |delay: Duration| {
            due.is_some_and(|due| {
                tokio::time::Instant::now()
                    .checked_add(delay)
                    .is_none_or(|then| then >= due)
            })
        };
        match retry.delay(attempt, asked) {
            Some(delay) if past_due(delay) => return Err(error),
            Some(delay) => {
                attempt += 1;
                progress.retrying(attempt, delay, false, error.turn_error());
                tokio::time::sleep(delay).await;
            }
            None => {
                let Some(fallback) = &retry.fallback else {
                    return Err(error);
                };
                progress.retrying(attempt + 1, Duration::ZERO, true, error.turn_error());
                return fallback.open_by(request, due).await;
            }
        }
    }
}

/// How much of its limits a turn has streamed.
#[derive(Default)]
struct Taken {
    chunks: usize,
    bytes: usize,
}

impl Taken {
    /// Counts `chunk`; the error that ends the turn when it is past the
    /// limits of `options` (it is then neither counted nor delivered).
    fn take(&mut self, chunk: &Chunk, options: &TurnOptions) -> Option<TurnError> {
        let chunks = self.chunks.saturating_add(1);
        let bytes = self.bytes.saturating_add(chunk.payload().len());
        // Named by the bound it went past, as the limit is given.
        let past = match (options.max_chunks, options.max_bytes) {
            (Some(most), _) if chunks > most => Some(plural(most, "chunk")),
            (_, Some(most)) if bytes > most => Some(plural(most, "byte")),
            _ => None,
        };
        if let Some(past) = past {
            return Some(TurnError::new(
                settle_core::TurnErrorKind::TooLarge,
                format!(
                    "the turn streamed more than a turn may ({past}); it was ended at the chunk past that, which was not kept"
                ),
            ));
        }
        (self.chunks, self.bytes) = (chunks, bytes);
        None
    }
}

/// `n` and `what`, in the plural but for one.
fn plural(n: usize, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

/// Waits until `due`, or forever without one.
async fn until(due: Option<tokio::time::Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

fn sink_end(error: SinkError) -> WorkEnd {
    match error {
        SinkError::Closed => WorkEnd::Cancelled(CancelledBy::SinkClosed),
        SinkError::Failed(error) => WorkEnd::Failed(error),
    }
}
