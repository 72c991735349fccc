//! The body of a work: open the provider's stream inside the work's scope,
//! read it to its end, and deliver each chunk to the sink.

use std::time::Duration;

use futures_util::StreamExt;

use crate::close::Close;
use crate::signal::{CancelledBy, WorkEnd};
use crate::sink::{ChunkSink, SinkError};
use crate::{Cut, IdleTimeout, Provider, Request, Scope, StreamEvent};

/// The default idle timeout of a turn's stream.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The timeouts of one turn's stream. The settle deadline is not here: it
/// is the lifecycle core's, which detaches a work that does not unwind in
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnOptions {
    /// No event for this long ends the turn with `idle_timeout`; zero
    /// disables, and so does a duration too long for the clock.
    pub idle_timeout: Duration,
    /// No first event within this ends the turn with `idle_timeout`; `None`
    /// means the idle timeout, zero disables.
    pub first_event_timeout: Option<Duration>,
}

impl Default for TurnOptions {
    fn default() -> Self {
        TurnOptions {
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            first_event_timeout: None,
        }
    }
}

/// What the body tells its work as it goes.
pub(crate) trait Progress {
    /// The stream is open and attached to the scope.
    fn attached(&mut self);
    /// The stream is closed.
    fn closed(&mut self);
}

impl Progress for () {
    fn attached(&mut self) {}
    fn closed(&mut self) {}
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
    let opened = tokio::select! {
        biased;
        () = token.cancelled() => return WorkEnd::Cancelled(CancelledBy::Request),
        () = close.closed() => return WorkEnd::Cancelled(CancelledBy::ForceClose),
        opened = provider.open(request) => opened,
    };
    let stream = match opened {
        Ok(stream) => stream,
        Err(error) => return WorkEnd::from_error(&error),
    };
    let first = options.first_event_timeout.unwrap_or(options.idle_timeout);
    let mut stream =
        scope.attach(IdleTimeout::new(stream, options.idle_timeout).first_event(first));
    progress.attached();
    let end = loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Chunk(chunk))) => {
                let delivered = tokio::select! {
                    biased;
                    () = token.cancelled() => Err(WorkEnd::Cancelled(CancelledBy::Request)),
                    sent = sink.chunk(chunk) => sent.map_err(sink_end),
                };
                if let Err(end) = delivered {
                    break end;
                }
            }
            Some(Ok(StreamEvent::KeepAlive)) => {}
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
    // Already closed at an end or an error; not when the sink stopped us.
    let _ = stream.close().await;
    progress.closed();
    end
}

fn sink_end(error: SinkError) -> WorkEnd {
    match error {
        SinkError::Closed => WorkEnd::Cancelled(CancelledBy::SinkClosed),
        SinkError::Failed(error) => WorkEnd::Failed(error),
    }
}
