//! The handoff a runtime uses to run a turn: spawn its work inside a
//! cancellation scope, cancel it, learn how it ended, and settle it within a
//! bound, detaching it when it will not stop (seed 001; G4, G5, G6).
//!
//! The building blocks are [`Turn::spawn`], [`TurnControl`] (cancel, force
//! close, detach) and [`TurnExit`] (the work's end, a future). [`settle`]
//! strings them together: cancel, bounded wait, detach.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::StreamExt;
use settle_core::{CancelMode, Outcome};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_util::sync::CancellationToken;

use crate::close::Close;
use crate::sink::{ChunkSink, SinkError};
use crate::Chunk;
use crate::{CloseHandle, Cut, ForceClosed, IdleTimeout, Provider, Request, Scope};
use crate::{StreamError, StreamEvent};

/// The default bound on how long cancelled work may take to unwind (G5).
pub const DEFAULT_SETTLE_TIMEOUT: Duration = Duration::from_secs(1);

/// The default idle timeout of a turn's stream.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// The timeouts of one turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TurnOptions {
    /// No event for this long ends the turn with `idle_timeout`; zero disables.
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

/// Who cancelled a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelledBy {
    /// The provider cancelled itself; the turn must not be cancelled again (G6).
    Provider,
    /// A cancel request (the turn's scope or an ancestor's was cancelled).
    Request,
    /// The handle closed the stream from outside.
    ForceClose,
    /// The chunk sink went away, so nobody was reading.
    SinkClosed,
}

/// How a turn's work ended.
#[derive(Debug, Clone)]
pub enum TurnEnd {
    /// The stream ended normally.
    Completed,
    /// The provider reported an error, or could not be reached.
    Failed(Arc<StreamError>),
    /// The idle or first-event timeout fired.
    IdleTimeout(Arc<StreamError>),
    /// The turn was cancelled.
    Cancelled(CancelledBy),
    /// The work was abandoned before it ended (see [`TurnControl::detach`]).
    Detached,
    /// The work panicked; its stream was closed by drop.
    Panicked,
}

impl TurnEnd {
    /// The outcome vocabulary word for this end.
    pub fn outcome(&self) -> Outcome {
        match self {
            TurnEnd::Completed => Outcome::Completed,
            TurnEnd::Failed(_) | TurnEnd::Panicked => Outcome::Failed,
            TurnEnd::IdleTimeout(_) => Outcome::IdleTimeout,
            TurnEnd::Cancelled(_) => Outcome::Cancelled,
            TurnEnd::Detached => Outcome::Detached,
        }
    }

    fn from_error(error: StreamError) -> TurnEnd {
        match error.outcome() {
            Outcome::IdleTimeout => TurnEnd::IdleTimeout(Arc::new(error)),
            Outcome::Cancelled => TurnEnd::Cancelled(CancelledBy::Provider),
            _ => TurnEnd::Failed(Arc::new(error)),
        }
    }
}

/// Runs one turn in the current task: opens the provider's stream inside
/// `scope`, reads it to its end and delivers its chunks to `sink`.
///
/// The stream is closed exactly once on every path before this returns: end,
/// error, timeout, cancel (even one that lands before or while the stream is
/// opened), force close. A future of this dropped mid-way closes it by drop.
/// [`Turn::spawn`] runs this on its own task.
pub async fn run_turn<K>(
    provider: &dyn Provider,
    request: &Request,
    scope: &Scope,
    sink: &mut K,
    options: TurnOptions,
) -> TurnEnd
where
    K: ChunkSink + ?Sized,
{
    let token = scope.token();
    // Biased: a scope born cancelled never opens a stream.
    let opened = tokio::select! {
        biased;
        _ = token.cancelled() => return TurnEnd::Cancelled(CancelledBy::Request),
        opened = provider.open(request) => opened,
    };
    let stream = match opened {
        Ok(stream) => stream,
        Err(error) => return TurnEnd::from_error(error),
    };
    let first = options.first_event_timeout.unwrap_or(options.idle_timeout);
    let mut stream =
        scope.attach(IdleTimeout::new(stream, options.idle_timeout).first_event(first));
    loop {
        match stream.next().await {
            Some(Ok(StreamEvent::Chunk(chunk))) => {
                let delivered = tokio::select! {
                    biased;
                    _ = token.cancelled() => Err(CancelledBy::Request),
                    sent = sink.chunk(chunk) => sent.map_err(|_| CancelledBy::SinkClosed),
                };
                if let Err(by) = delivered {
                    let _ = stream.close().await;
                    return TurnEnd::Cancelled(by);
                }
            }
            Some(Ok(StreamEvent::KeepAlive)) => {}
            Some(Err(error)) => return TurnEnd::from_error(error),
            None => {
                return match scope.close_handle().cut() {
                    None => TurnEnd::Completed,
                    Some(Cut::Cancelled) => TurnEnd::Cancelled(CancelledBy::Request),
                    Some(Cut::ForceClosed) => TurnEnd::Cancelled(CancelledBy::ForceClose),
                };
            }
        }
    }
}

static NEXT_TURN: AtomicU64 = AtomicU64::new(1);

/// Identifies one spawned turn, so a detach applies to its own turn only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TurnId(u64);

impl TurnId {
    fn next() -> Self {
        TurnId(NEXT_TURN.fetch_add(1, Ordering::Relaxed))
    }

    /// The number, unique within the process.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for TurnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "turn-{}", self.0)
    }
}

/// What [`TurnControl::cancel`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelIssued {
    /// The turn's scope was cancelled now; its stream closes and its work
    /// unwinds.
    Cancelled,
    /// Graceful: the current turn is left to finish.
    LetFinish,
    /// The scope was already cancelled; nothing was done.
    AlreadyCancelled,
    /// The work had already ended (maybe by cancelling itself); it is not
    /// cancelled again (G6).
    AlreadyEnded,
}

/// A spawned turn: its control and its exit. Dropping it detaches the turn.
#[derive(Debug)]
pub struct Turn {
    control: TurnControl,
    exit: TurnExit,
}

impl Turn {
    /// Spawns the work of one turn on the current tokio runtime.
    ///
    /// The turn's scope (a child of `session`) exists before this returns, so
    /// a cancel of `session` at any later moment (or earlier: the child is
    /// born cancelled) reaches the turn, whether its stream is open, opening
    /// or not yet asked for. Chunks go to `sink` until the turn is detached.
    ///
    /// Panics outside a tokio runtime, like `tokio::spawn`.
    pub fn spawn<K>(
        provider: Arc<dyn Provider>,
        request: Request,
        session: &CancellationToken,
        sink: K,
        options: TurnOptions,
    ) -> Turn
    where
        K: ChunkSink,
    {
        let id = TurnId::next();
        let scope = Scope::new(session);
        let ended = Arc::new(AtomicBool::new(false));
        let revoked = CancellationToken::new();
        let mut sink = Revocable {
            sink,
            revoked: revoked.clone(),
        };
        let work_scope = scope.clone();
        let work_ended = ended.clone();
        let join = tokio::spawn(async move {
            let end = run_turn(&*provider, &request, &work_scope, &mut sink, options).await;
            work_ended.store(true, Ordering::Release);
            tracing::debug!(turn = %id, outcome = %end.outcome(), "turn work exited");
            end
        });
        Turn {
            control: TurnControl {
                id,
                token: scope.token().clone(),
                close: scope.close_handle().clone(),
                ended,
                revoked,
                abort: join.abort_handle(),
                detached: false,
            },
            exit: TurnExit {
                id,
                join,
                end: None,
            },
        }
    }

    /// This turn's id.
    pub fn id(&self) -> TurnId {
        self.control.id
    }

    /// The control half.
    pub fn control(&self) -> &TurnControl {
        &self.control
    }

    /// Cancels the turn; see [`TurnControl::cancel`].
    pub fn cancel(&self, mode: CancelMode) -> CancelIssued {
        self.control.cancel(mode)
    }

    /// Waits for the work to end; see [`TurnExit`].
    pub async fn exited(&mut self) -> TurnEnd {
        (&mut self.exit).await
    }

    /// Splits the turn so a driver can keep the control in its tables and
    /// poll the exit among its other events.
    pub fn into_parts(self) -> (TurnControl, TurnExit) {
        (self.control, self.exit)
    }
}

/// Cancels a turn and, at the settle deadline, detaches it. Dropping it
/// detaches the turn (its stream is closed, its work abandoned), so keep it
/// as long as the turn runs.
pub struct TurnControl {
    id: TurnId,
    token: CancellationToken,
    close: CloseHandle,
    ended: Arc<AtomicBool>,
    revoked: CancellationToken,
    abort: AbortHandle,
    detached: bool,
}

impl fmt::Debug for TurnControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TurnControl")
            .field("id", &self.id)
            .field("cancelled", &self.token.is_cancelled())
            .field("ended", &self.has_ended())
            .field("detached", &self.detached)
            .finish()
    }
}

/// What [`TurnControl::detach`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Detached {
    /// The turn detached.
    pub id: TurnId,
    /// Whether the work had ended by itself; `false` means it was abandoned
    /// still running.
    pub work_ended: bool,
    /// What the force close did to the stream.
    pub stream: ForceClosed,
}

impl TurnControl {
    /// This turn's id.
    pub fn id(&self) -> TurnId {
        self.id
    }

    /// The turn's cancellation token (a child of the session's).
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// The handle that closes the turn's stream from outside.
    pub fn close_handle(&self) -> &CloseHandle {
        &self.close
    }

    /// Whether the work has ended (completed, failed, timed out, cancelled,
    /// by itself or not).
    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::Acquire)
    }

    /// Asks the turn to stop. `Immediate` cancels its scope: the stream is
    /// closed and the work unwinds; `Graceful` lets the current turn finish
    /// (a turn is one stream, so there is nothing to stop early). A turn
    /// whose work already ended is not cancelled again (G6).
    pub fn cancel(&self, mode: CancelMode) -> CancelIssued {
        if self.has_ended() {
            return CancelIssued::AlreadyEnded;
        }
        match mode {
            CancelMode::Graceful => CancelIssued::LetFinish,
            CancelMode::Immediate if self.token.is_cancelled() => CancelIssued::AlreadyCancelled,
            CancelMode::Immediate => {
                self.token.cancel();
                CancelIssued::Cancelled
            }
        }
    }

    /// Detaches the turn: revokes its sink (a detached work writes nothing
    /// more), force-closes its stream (once: a no-op if it is closed), and
    /// aborts its task. The work is not cancelled by this (G6); a work stuck
    /// outside an await point keeps running, but without its stream and
    /// without write access.
    pub fn detach(mut self) -> Detached {
        self.detach_in_place()
    }

    fn detach_in_place(&mut self) -> Detached {
        let work_ended = self.has_ended();
        if self.detached {
            return Detached {
                id: self.id,
                work_ended,
                stream: ForceClosed::NothingOpen,
            };
        }
        self.detached = true;
        self.revoked.cancel();
        let stream = self.close.close();
        self.abort.abort();
        Detached {
            id: self.id,
            work_ended,
            stream,
        }
    }
}

impl Drop for TurnControl {
    fn drop(&mut self) {
        self.detach_in_place();
    }
}

/// The end of a turn's work, as a future. Cancel safe: poll it in a
/// `select!` as often as needed; once it has produced the end it keeps
/// producing the same end.
#[derive(Debug)]
pub struct TurnExit {
    id: TurnId,
    join: JoinHandle<TurnEnd>,
    end: Option<TurnEnd>,
}

impl TurnExit {
    /// The turn this is the exit of.
    pub fn id(&self) -> TurnId {
        self.id
    }
}

impl Future for TurnExit {
    type Output = TurnEnd;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<TurnEnd> {
        if let Some(end) = &self.end {
            return Poll::Ready(end.clone());
        }
        let end = match std::task::ready!(Pin::new(&mut self.join).poll(cx)) {
            Ok(end) => end,
            Err(error) if error.is_cancelled() => TurnEnd::Detached,
            Err(_) => TurnEnd::Panicked,
        };
        self.end = Some(end.clone());
        Poll::Ready(end)
    }
}

/// How a turn settled.
#[derive(Debug, Clone)]
pub struct Settled {
    /// The turn.
    pub id: TurnId,
    /// How its work ended; [`TurnEnd::Detached`] if the settle deadline passed.
    pub end: TurnEnd,
    /// Whether it was cancelled by this settle (`false` if it had already
    /// ended or cancelled itself, G6).
    pub cancelled: bool,
}

impl Settled {
    /// The outcome vocabulary word.
    pub fn outcome(&self) -> Outcome {
        self.end.outcome()
    }
}

/// Settles `turn` within `settle_timeout` (G5): an unfinished turn is
/// cancelled immediately (one that already ended or cancelled itself is not,
/// G6), its work gets at most `settle_timeout` to unwind, and then the turn
/// is detached: [`TurnControl::detach`] runs, then `detach` is called with
/// this turn's id (to drop it from the driver's tables).
///
/// Detaching always happens, exactly once, even if this future is dropped
/// before it completes. A work still running at the deadline is logged with
/// `tracing::warn!` and reported as [`TurnEnd::Detached`].
pub async fn settle<F>(turn: Turn, settle_timeout: Duration, detach: F) -> Settled
where
    F: FnOnce(TurnId),
{
    let Turn { control, mut exit } = turn;
    let id = control.id;
    let mut guard = DetachOnDrop(Some((control, detach)));
    let cancelled = match &guard.0 {
        Some((control, _)) => control.cancel(CancelMode::Immediate) == CancelIssued::Cancelled,
        None => false,
    };
    let end = match tokio::time::timeout(settle_timeout, &mut exit).await {
        Ok(end) => end,
        Err(_) => {
            tracing::warn!(
                turn = %id,
                ?settle_timeout,
                "the turn's work did not unwind within the settle timeout; detaching it"
            );
            TurnEnd::Detached
        }
    };
    guard.run();
    Settled { id, end, cancelled }
}

struct DetachOnDrop<F: FnOnce(TurnId)>(Option<(TurnControl, F)>);

impl<F: FnOnce(TurnId)> DetachOnDrop<F> {
    fn run(&mut self) {
        if let Some((control, detach)) = self.0.take() {
            let id = control.id;
            control.detach();
            detach(id);
        }
    }
}

impl<F: FnOnce(TurnId)> Drop for DetachOnDrop<F> {
    fn drop(&mut self) {
        self.run();
    }
}

/// A sink that refuses writes once its turn is detached.
struct Revocable<K> {
    sink: K,
    revoked: CancellationToken,
}

#[async_trait]
impl<K: ChunkSink> ChunkSink for Revocable<K> {
    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError> {
        if self.revoked.is_cancelled() {
            return Err(SinkError::Closed);
        }
        self.sink.chunk(chunk).await
    }
}
