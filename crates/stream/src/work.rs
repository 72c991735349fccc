//! [`Work`] and [`WorkControl`]: the one way a runtime runs a turn's work and
//! executes the lifecycle core's orders on it (cancel, close its stream,
//! detach). The settle deadline is not here: the core owns it and orders
//! the detach (seed 001; G4, G5, G6).

use std::any::Any;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use futures_util::FutureExt;
use settle_core::{CancelMode, TurnError, TurnErrorKind};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::run::{run, Progress};
use crate::signal::{SignalSink, WorkEnd, WorkSignal};
use crate::sink::{ChunkSink, SinkError};
use crate::{Chunk, ForceClosed, Provider, Request, Scope, TurnOptions};

/// What one work runs: a provider, the request of its turn, and the
/// stream's timeouts. [`spawn`](Self::spawn) starts it.
///
/// ```
/// use std::sync::Arc;
/// use settle_core::{CancelMode, Outcome};
/// use settle_stream::{Chunk, Keyed, Request, ScriptedProvider, TurnScript};
/// use settle_stream::{Work, WorkEnd, WorkSignal};
/// use tokio::sync::mpsc;
/// use tokio_util::task::TaskTracker;
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let provider = Arc::new(ScriptedProvider::new([TurnScript::new(["hel", "lo"])]));
/// let tracker = TaskTracker::new();
/// let (chunks, mut persisted) = mpsc::unbounded_channel::<Chunk>();
/// let (signals, mut reports) = mpsc::unbounded_channel();
///
/// let control = Work::new(provider, Request::prompt("greet me"))
///     .spawn(&tracker, chunks, Keyed::new("turn 1", signals));
///
/// let mut seen = Vec::new();
/// while let Some((_turn, signal)) = reports.recv().await {
///     let ended = matches!(signal, WorkSignal::Ended(_));
///     seen.push(signal);
///     if ended {
///         break;
///     }
/// }
/// assert_eq!(
///     seen,
///     [
///         WorkSignal::StreamAttached,
///         WorkSignal::StreamClosed,
///         WorkSignal::Ended(WorkEnd::Completed),
///     ]
/// );
/// assert_eq!(persisted.recv().await.unwrap(), Chunk::text("hel"));
/// // G6: a work that ended is not cancelled.
/// let mut control = control;
/// assert_eq!(control.cancel(CancelMode::Immediate), settle_stream::CancelIssued::AlreadyEnded);
/// # }
/// ```
pub struct Work {
    provider: Arc<dyn Provider>,
    request: Request,
    options: TurnOptions,
    span: Option<tracing::Span>,
    scope: Option<Scope>,
}

impl fmt::Debug for Work {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Work")
            .field("messages", &self.request.messages.len())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl Work {
    /// The work of one turn: `request` sent to `provider`, with the default
    /// [`TurnOptions`].
    pub fn new(provider: Arc<dyn Provider>, request: Request) -> Self {
        Work {
            provider,
            request,
            options: TurnOptions::default(),
            span: None,
            scope: None,
        }
    }

    /// Spawns the work in `scope` (by default a scope of its own), made by
    /// the caller so that its sink can watch the work's cancel: a sink that
    /// must end promptly once its work is cancelled holds a clone of the
    /// scope's token.
    pub fn scope(mut self, scope: Scope) -> Self {
        self.scope = Some(scope);
        self
    }

    /// Sets the stream's timeouts.
    pub fn options(mut self, options: TurnOptions) -> Self {
        self.options = options;
        self
    }

    /// Runs the spawned work inside `span` (by default the span current at
    /// [`spawn`](Self::spawn)).
    pub fn span(mut self, span: tracing::Span) -> Self {
        self.span = Some(span);
        self
    }

    /// Runs the work in the current task, inside `scope`, delivering its
    /// chunks to `sink`: for a caller that reads a turn inline rather than
    /// beside others. A runtime uses [`spawn`](Self::spawn), which adds
    /// what that needs: its own tracked task, panics caught, signals, cancel
    /// once, detach.
    ///
    /// The stream is closed exactly once on every path before this returns:
    /// end, error, timeout, cancel of `scope` (even one that lands before or
    /// while the stream is opened), force close, a sink that refuses. A
    /// future of this dropped mid-way closes it by drop.
    pub async fn run<K>(self, scope: &Scope, sink: &mut K) -> WorkEnd
    where
        K: ChunkSink + ?Sized,
    {
        // Inline, the work runs in the caller's span.
        run(
            &*self.provider,
            &self.request,
            scope,
            sink,
            self.options,
            &mut (),
        )
        .await
    }

    /// Spawns the work on the current tokio runtime, tracked by `tracker`.
    ///
    /// Each chunk goes to `sink` before anything else sees it; the work's
    /// signals go to `signals`: [`WorkSignal::StreamAttached`],
    /// [`WorkSignal::StreamClosed`], and [`WorkSignal::Ended`] exactly once
    /// on every path: a panic in the provider's `open`, in its stream or in
    /// the sink ends it [`WorkEnd::Panicked`], its stream closed (G4). After
    /// [`WorkControl::detach`] (or the control's drop) nothing more is
    /// reported: the caller ordered it and already knows.
    ///
    /// The work's scope (its own cancellation token and close handle) exists
    /// before this returns, so an order given at any later moment reaches
    /// the work whether its stream is open, opening, or not yet asked for.
    ///
    /// Panics outside a tokio runtime, like `tokio::spawn`.
    pub fn spawn<K, R>(self, tracker: &TaskTracker, sink: K, signals: R) -> WorkControl
    where
        K: ChunkSink,
        R: SignalSink,
    {
        let Work {
            provider,
            request,
            options,
            span,
            scope,
        } = self;
        let scope = scope.unwrap_or_default();
        let shared = Arc::new(Shared::default());
        let mut sink = Revocable {
            sink,
            shared: shared.clone(),
        };
        let mut reporter = Reporter {
            signals,
            shared: shared.clone(),
            attached: false,
            closed: false,
            ended: false,
        };
        let work_scope = scope.clone();
        let work = async move {
            let body = run(
                &*provider,
                &request,
                &work_scope,
                &mut sink,
                options,
                &mut reporter,
            );
            // Whatever the body held (its stream included) is dropped,
            // and so closed, before the end is reported.
            let end = match AssertUnwindSafe(body).catch_unwind().await {
                Ok(end) => end,
                Err(panic) => WorkEnd::Panicked(panic_error(&*panic)),
            };
            reporter.end(end);
        };
        let span = span.unwrap_or_else(tracing::Span::current);
        // Boxed: the task's own future is then a pointer and a span, not
        // the whole body with its stream's state, which the runtime moves
        // by value each time the task's stage changes (its end, its output
        // taken): a teardown paid a copy of about 1.5 KiB three times per
        // work, for one allocation at its start.
        let task = tracker.spawn(Box::pin(work).instrument(span));
        WorkControl {
            scope,
            shared,
            abort: task.abort_handle(),
            cancelled: None,
            detached: false,
        }
    }
}

/// What the control and the work share.
#[derive(Default)]
struct Shared {
    /// The work has ended (it set this before reporting its end).
    ended: AtomicBool,
    /// The work was detached: its sink refuses, its signals are dropped.
    detached: AtomicBool,
}

impl Shared {
    fn is_detached(&self) -> bool {
        self.detached.load(Ordering::Acquire)
    }
}

/// Cancels a spawned [`Work`], closes its stream, detaches it: the orders a
/// lifecycle core gives about a work, executed. Dropping it detaches the
/// work (its write access is revoked first), so keep it as long as the
/// work may run.
pub struct WorkControl {
    scope: Scope,
    shared: Arc<Shared>,
    abort: AbortHandle,
    cancelled: Option<CancelMode>,
    detached: bool,
}

impl fmt::Debug for WorkControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkControl")
            .field("cancelled", &self.cancelled)
            .field("ended", &self.has_ended())
            .field("detached", &self.detached)
            .finish()
    }
}

/// What [`WorkControl::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelIssued {
    /// The work's scope was cancelled now: its stream ends and is closed,
    /// and the work unwinds.
    Cancelled,
    /// Graceful: recorded; the current turn is left to finish (the core's
    /// settle deadline bounds it).
    LetFinish,
    /// The work was already cancelled at least this hard; nothing was done
    /// (G6).
    AlreadyCancelled,
    /// The work had already ended (maybe by cancelling itself); it is not
    /// cancelled again (G6).
    AlreadyEnded,
}

/// What [`WorkControl::detach`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detached {
    /// Whether the work had ended by itself; `false` means it was abandoned
    /// still running.
    pub work_ended: bool,
    /// What the force close did to its stream.
    pub stream: ForceClosed,
}

impl WorkControl {
    /// Asks the work to stop, at most once per mode and never after it ended
    /// (G6). `Immediate` cancels the work's scope: its stream is closed and
    /// it unwinds. `Graceful` only records the request: a turn is one
    /// stream, so there is nothing to stop early, and the core's settle
    /// deadline bounds it. An immediate cancel after a graceful one still
    /// cancels.
    pub fn cancel(&mut self, mode: CancelMode) -> CancelIssued {
        if self.has_ended() {
            return CancelIssued::AlreadyEnded;
        }
        match (mode, self.cancelled) {
            (_, Some(CancelMode::Immediate))
            | (CancelMode::Graceful, Some(CancelMode::Graceful)) => CancelIssued::AlreadyCancelled,
            (CancelMode::Graceful, None) => {
                self.cancelled = Some(CancelMode::Graceful);
                CancelIssued::LetFinish
            }
            (CancelMode::Immediate, _) => {
                self.cancelled = Some(CancelMode::Immediate);
                self.scope.token().cancel();
                CancelIssued::Cancelled
            }
        }
    }

    /// Closes the work's stream from outside, without waiting for the work:
    /// at once if it is open, as soon as it is attached if it is still being
    /// opened (a cancel that raced the attach), and the work stops waiting
    /// for an open in flight. Idempotent: once closed, `NothingOpen`.
    pub fn close_stream(&self) -> ForceClosed {
        self.scope.close_handle().close()
    }

    /// Abandons the work: revokes its write access first (its sink refuses
    /// every chunk from now on and it reports nothing more), then
    /// force-closes its stream and aborts its task. This does not cancel it
    /// (G6). A work stuck outside an await point keeps running until it
    /// reaches one, but without its stream and without write access; a
    /// chunk its sink had already taken may still land, which is why a
    /// store refuses writes to a turn it has closed.
    pub fn detach(mut self) -> Detached {
        self.detach_in_place()
    }

    /// Whether the work has ended (completed, failed, timed out, cancelled,
    /// panicked), whether or not its end has been received yet.
    pub fn has_ended(&self) -> bool {
        self.shared.ended.load(Ordering::Acquire)
    }

    /// The hardest cancel asked so far.
    pub fn cancelled(&self) -> Option<CancelMode> {
        self.cancelled
    }

    /// The work's own cancellation token.
    pub fn token(&self) -> &CancellationToken {
        self.scope.token()
    }

    fn detach_in_place(&mut self) -> Detached {
        let work_ended = self.has_ended();
        if self.detached {
            return Detached {
                work_ended,
                stream: ForceClosed::NothingOpen,
            };
        }
        self.detached = true;
        self.shared.detached.store(true, Ordering::Release);
        let stream = self.scope.close_handle().close();
        self.abort.abort();
        Detached { work_ended, stream }
    }
}

impl Drop for WorkControl {
    fn drop(&mut self) {
        // A work that has ended has nothing left to revoke, close or abort:
        // dropping its control is free (a teardown drops thousands).
        if !self.has_ended() {
            self.detach_in_place();
        }
    }
}

/// Reports a work's signals in order, its end exactly once (from its drop
/// if the task is dropped before the end), and nothing once it is detached.
struct Reporter<R: SignalSink> {
    signals: R,
    shared: Arc<Shared>,
    attached: bool,
    closed: bool,
    ended: bool,
}

impl<R: SignalSink> Reporter<R> {
    fn send(&mut self, signal: WorkSignal) {
        if !self.shared.is_detached() {
            self.signals.signal(signal);
        }
    }

    fn end(&mut self, end: WorkEnd) {
        if self.ended {
            return;
        }
        self.ended = true;
        // A panic or a drop left the stream to its drop, which closed it.
        self.closed();
        self.shared.ended.store(true, Ordering::Release);
        self.send(WorkSignal::Ended(end));
    }
}

impl<R: SignalSink> Progress for Reporter<R> {
    fn attached(&mut self) {
        self.attached = true;
        self.send(WorkSignal::StreamAttached);
    }

    fn closed(&mut self) {
        if self.attached && !self.closed {
            self.closed = true;
            self.send(WorkSignal::StreamClosed);
        }
    }

    fn retrying(
        &mut self,
        attempt: u32,
        delay: std::time::Duration,
        fallback: bool,
        error: settle_core::TurnError,
    ) {
        tracing::warn!(attempt, ?delay, fallback, %error.message, "retrying the turn's stream");
        self.send(WorkSignal::Retrying {
            attempt,
            delay,
            fallback,
            error,
        });
    }

    fn usage(&mut self, tokens: u64) {
        self.send(WorkSignal::Usage { tokens });
    }
}

impl<R: SignalSink> Drop for Reporter<R> {
    fn drop(&mut self) {
        // The task was dropped before the work ended: aborted by a detach
        // (which silenced us), or its runtime shut down.
        self.end(WorkEnd::Abandoned);
    }
}

/// A sink that refuses writes once its work is detached.
struct Revocable<K> {
    sink: K,
    shared: Arc<Shared>,
}

#[async_trait]
impl<K: ChunkSink> ChunkSink for Revocable<K> {
    async fn begin(&mut self) -> Result<(), SinkError> {
        if self.shared.is_detached() {
            return Err(SinkError::Closed);
        }
        self.sink.begin().await
    }

    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError> {
        if self.shared.is_detached() {
            return Err(SinkError::Closed);
        }
        self.sink.chunk(chunk).await
    }
}

/// A panic as a turn error: kind `panic`, the panic's message.
fn panic_error(panic: &(dyn Any + Send)) -> TurnError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_owned());
    TurnError::new(
        TurnErrorKind::Panic,
        format!("the turn's work panicked: {message}"),
    )
}
