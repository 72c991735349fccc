use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use futures_util::Stream;
use settle_core::{ChunkKind, Outcome, TurnError, WorkId};
use settle_stream::{Chunk, Reply, ReplyBuilder, ToolCall, ToolCalls};
use tokio::sync::{mpsc, oneshot};

use crate::canceller::{cancel_work, WorkCanceller};
use crate::chunk_queue::ChunkReceiver;
use crate::command::Command;

/// A turn in flight: a [`Stream`] of its chunks (text, or a tool call,
/// reasoning, usage as JSON), each yielded once the store has it (G7), then
/// its outcome.
///
/// Dropping a `Turn` before its stream has ended cancels the turn (its
/// provider stream is closed, G4): a consumer that goes away does not leave a
/// stream running and spending. So does dropping the future of
/// [`outcome`](Self::outcome), [`result`](Self::result), [`end`](Self::end)
/// or [`reply`](Self::reply) before it is ready (a timeout around it, its
/// task aborted): the wait given up on takes the turn with it. Once the
/// stream has ended, or once one of those has answered, dropping it does
/// nothing.
///
/// # The next turn after a cancelled one
///
/// A cancelled turn settles on its own task: its work unwinds and closes
/// its stream, for at most the settle timeout (G5). A turn started on the
/// session meanwhile (say, right after dropping the `Turn` of the answer a
/// user stopped) waits until the cancelled one has ended, then starts; a
/// work that ignores its cancel is detached at the settle deadline, so the
/// wait is bounded by it. Awaiting [`outcome`](Self::outcome) after
/// [`cancel`](Self::cancel) waits for the same end, with how it went:
///
/// ```ignore
/// drop(turn); // or: turn.cancel(); let _ = turn.outcome().await;
/// let next = session.run_turn(provider, request).await?; // after its end
/// ```
///
/// # What the chunks promise (G7)
///
/// Every chunk a `Turn` yields is persisted: it is yielded only once the
/// store acknowledged it, and it survives a crash. The converse holds too:
/// every persisted chunk is yielded, in order, before the stream ends,
/// whether the turn ended on its own or was cancelled (the chunk on its way
/// to the store when the cancel landed is yielded once the store says it
/// kept it). It does not hold for a detached turn (its work did not end
/// within the settle timeout, and its writes were cut off wherever they
/// were), nor for that last chunk of a cancelled turn when the store does
/// not answer within the settle timeout: the yielded chunks are then a
/// prefix of the stored ones; read the store (`settle show`,
/// [`Kernel::session_detail`](crate::Kernel::session_detail)) for the rest.
#[derive(Debug)]
pub struct Turn {
    work: WorkId,
    chunks: ChunkReceiver,
    /// The tool calls of the chunks yielded so far, put together.
    calls: ToolCalls,
    /// How many times its opening was retried (the driver counts).
    retries: Arc<AtomicU32>,
    outcome: Option<oneshot::Receiver<crate::command::WorkEnd>>,
    /// Its end, once [`try_end`](Turn::try_end) found it told.
    ended: Option<crate::command::WorkEnd>,
    /// Where a cancel goes; set until the turn is known to be over.
    cancel_on_drop: Option<mpsc::WeakUnboundedSender<Command>>,
}

impl Turn {
    pub(crate) fn new(
        work: WorkId,
        chunks: ChunkReceiver,
        outcome: oneshot::Receiver<crate::command::WorkEnd>,
        retries: Arc<AtomicU32>,
    ) -> Self {
        Turn {
            work,
            chunks,
            calls: ToolCalls::default(),
            retries,
            outcome: Some(outcome),
            ended: None,
            cancel_on_drop: None,
        }
    }

    pub(crate) fn cancel_on_drop(mut self, commands: mpsc::WeakUnboundedSender<Command>) -> Self {
        self.cancel_on_drop = Some(commands);
        self
    }

    /// A turn whose start the store did not take, refused to its caller:
    /// its work fails on its own with the store's cause, so dropping the
    /// handle must not cancel it (a cancel racing that failure would store
    /// the turn `cancelled`, without the cause).
    pub(crate) fn refused(mut self) {
        self.cancel_on_drop = None;
    }

    /// Which work this is: the session and the turn's number.
    pub fn work(&self) -> WorkId {
        self.work
    }

    /// The next chunk, once persisted; `None` when the turn has ended.
    pub async fn next_chunk(&mut self) -> Option<Chunk> {
        let chunk = self.chunks.recv().await;
        self.saw(chunk.as_ref());
        chunk
    }

    /// The next chunk if one is persisted and waiting, without waiting:
    /// `Ready(Some(chunk))`, `Ready(None)` once the turn has ended, and
    /// `Pending` while the next one is not persisted yet. A frontend that
    /// bridges each read to another event loop (the Python package) takes
    /// a waiting chunk this way instead of a round trip through the runtime.
    /// Nothing is lost by asking: a `Pending` leaves the turn as it was.
    pub fn try_next_chunk(&mut self) -> Poll<Option<Chunk>> {
        let chunk = match self.chunks.try_recv() {
            Ok(chunk) => Some(chunk),
            Err(mpsc::error::TryRecvError::Empty) => return Poll::Pending,
            Err(mpsc::error::TryRecvError::Disconnected) => None,
        };
        self.saw(chunk.as_ref());
        Poll::Ready(chunk)
    }

    /// Notes a chunk on its way to the caller (`None`: the stream ended).
    fn saw(&mut self, chunk: Option<&Chunk>) {
        match chunk {
            Some(chunk) if chunk.kind() == ChunkKind::ToolCall => {
                self.calls.push(&chunk.to_json());
            }
            Some(_) => {}
            None => self.cancel_on_drop = None,
        }
    }

    /// The tool calls the model made in the chunks yielded so far, each
    /// put together from its streamed pieces: all of the turn's once its
    /// stream has ended. A tool-call loop runs them (under
    /// [`SessionHandle::spawn`](crate::SessionHandle::spawn)) and sends their
    /// results with the next turn.
    pub fn tool_calls(&self) -> &[ToolCall] {
        self.calls.calls()
    }

    /// How many times opening its stream was retried before the first
    /// chunk (its [`RetryPolicy`](settle_stream::RetryPolicy)); each retry
    /// is also a [`LifecycleEvent::TurnRetried`](crate::LifecycleEvent::TurnRetried).
    pub fn retries(&self) -> u32 {
        self.retries.load(Ordering::Relaxed)
    }

    /// Reads the turn to its end and returns it whole: how it ended, why if
    /// it failed, and its [`Reply`] (text, reasoning, usage of the chunks
    /// not yet read; the tool calls of the whole turn).
    ///
    /// ```ignore
    /// let done = session.run_turn(provider, request).await?.reply().await;
    /// for call in &done.reply.tool_calls { /* run it, send its result */ }
    /// let next = done.reply.to_message(); // the assistant message, tool calls included
    /// ```
    pub async fn reply(mut self) -> TurnReply {
        let mut reply = ReplyBuilder::default();
        while let Some(chunk) = self.chunks.recv().await {
            if chunk.kind() != ChunkKind::ToolCall {
                reply.push(&chunk);
            }
            self.saw(Some(&chunk));
        }
        self.saw(None);
        let calls = std::mem::take(&mut self.calls).finish();
        // Read once the end is known: the driver counted every retry
        // before it learnt of the end (one channel, in order).
        let retries = self.retries.clone();
        let (outcome, error) = self.finish().await;
        let retries = retries.load(Ordering::Relaxed);
        let mut reply = reply.finish();
        reply.tool_calls = calls;
        TurnReply {
            outcome,
            error,
            reply,
            retries,
        }
    }

    /// Cancels this turn now (its stream is closed); the session stays open.
    /// A turn that already ended is not cancelled again (G6).
    pub fn cancel(&self) {
        if let Some(commands) = self.cancel_on_drop.as_ref() {
            cancel_work(self.work, commands);
        }
    }

    /// What cancels this turn apart from its handle, at once: for a
    /// frontend whose reader and closer are different objects (a Python
    /// future cancelled by its task). `None` once the handle knows the turn
    /// is over (nothing left to cancel).
    pub fn canceller(&self) -> Option<WorkCanceller> {
        let commands = self.cancel_on_drop.as_ref()?;
        Some(WorkCanceller::new(self.work, commands.clone()))
    }

    /// How the turn ended, once it has: the chunks not yet read are dropped
    /// unread (they are persisted all the same). `Interrupted` if the kernel
    /// stopped before it could say. It is told once the store has the
    /// turn's end, or at the store timeout if the store has not taken it by
    /// then (a lock, a full disk): the end is written once the store heals.
    /// The store timeout counts from when the end's write is first tried,
    /// wherever the write waits then: behind other store calls once the
    /// store is known stalled (none of them answered within the store
    /// timeout), or tried again after the store refused it. A cancelled
    /// turn's end comes after its work unwinds (up to the settle timeout).
    pub async fn outcome(self) -> Outcome {
        self.finish().await.0
    }

    /// How the turn ended, if its end has been told, without waiting for it
    /// and without giving up the handle: the chunks not read yet can still
    /// be read, and [`end`](Self::end) answers the same. `None` while the
    /// turn runs (or its end is not written yet: it is told as
    /// [`outcome`](Self::outcome) says). For a frontend whose handle is
    /// asked how its turn ended after its session was closed, without
    /// reading it.
    pub fn try_end(&mut self) -> Option<&(Outcome, Option<TurnError>)> {
        if self.ended.is_none() {
            let told = match self.outcome.as_mut().map(oneshot::Receiver::try_recv) {
                Some(Ok(end)) => Some(end),
                Some(Err(oneshot::error::TryRecvError::Closed)) => {
                    Some((Outcome::Interrupted, None))
                }
                Some(Err(oneshot::error::TryRecvError::Empty)) | None => None,
            };
            if told.is_some() {
                self.outcome = None;
                self.ended = told;
            }
        }
        self.ended.as_ref()
    }

    /// How the turn ended, with the reason when it failed or timed out:
    /// `Ok(outcome)` unless the turn failed (`Failed`, `IdleTimeout`), whose
    /// [`TurnError`] says why (an HTTP status, a refused connection, a
    /// truncated reply, a panic).
    pub async fn result(self) -> Result<Outcome, TurnError> {
        match self.finish().await {
            (_, Some(error)) => Err(error),
            (outcome, None) => Ok(outcome),
        }
    }

    /// How the turn ended and, when it failed or timed out, why: both at
    /// once, for a frontend that reports the two (the gateway's
    /// `turn.ended`). Like [`outcome`](Self::outcome), unread chunks are
    /// dropped unread.
    pub async fn end(self) -> (Outcome, Option<TurnError>) {
        self.finish().await
    }

    /// The turn as a stream of results: each chunk as `Ok`, once
    /// persisted, then, if the turn failed or timed out, its error as one
    /// last `Err` (the in-line view of [`result`](Self::result)).
    ///
    /// ```ignore
    /// let mut results = turn.results();
    /// while let Some(item) = results.next().await {
    ///     match item {
    ///         Ok(chunk) => print!("{}", chunk.as_text().unwrap_or_default()),
    ///         Err(error) => eprintln!("the turn failed: {error}"),
    ///     }
    /// }
    /// ```
    pub fn results(self) -> TurnResults {
        Box::pin(futures_util::stream::unfold(
            Some(self),
            |turn| async move {
                let mut turn = turn?;
                match turn.next_chunk().await {
                    Some(chunk) => Some((Ok(chunk), Some(turn))),
                    None => match turn.end().await {
                        (_, Some(error)) => Some((Err(error), None)),
                        (_, None) => None,
                    },
                }
            },
        ))
    }

    async fn finish(mut self) -> (Outcome, Option<TurnError>) {
        // Nobody reads the rest: the work must not wait for a reader
        // (back-pressure), so its hand-offs fail and it persists on.
        self.chunks.close();
        let end = match (self.ended.take(), self.outcome.take()) {
            (Some(end), _) => end,
            (None, Some(rx)) => rx.await.unwrap_or((Outcome::Interrupted, None)),
            (None, None) => (Outcome::Interrupted, None),
        };
        // Told its end: the handle has nothing left to cancel. Until then
        // it is still armed, so a wait given up on (a timeout, an aborted
        // task) drops it as a consumer gone, and the turn is cancelled.
        self.cancel_on_drop = None;
        end
    }
}

impl Stream for Turn {
    type Item = Chunk;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        let polled = self.chunks.poll_recv(cx);
        if let Poll::Ready(chunk) = &polled {
            let chunk = chunk.as_ref();
            self.saw(chunk);
        }
        polled
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.cancel();
    }
}

/// A turn as a stream of results ([`Turn::results`]): its chunks, then its
/// error if it failed. Dropping it before the end cancels the turn.
pub type TurnResults = Pin<Box<dyn Stream<Item = Result<Chunk, TurnError>> + Send>>;

/// A turn read to its end ([`Turn::reply`]).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct TurnReply {
    /// How it ended.
    pub outcome: Outcome,
    /// Why, when it failed or timed out.
    pub error: Option<TurnError>,
    /// What it said: text, reasoning, tool calls whole, usage.
    pub reply: Reply,
    /// How many times opening its stream was retried.
    pub retries: u32,
}
