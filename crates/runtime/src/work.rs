//! The works the driver holds: a turn runs as the stream crate's [`Work`]
//! (its own tracked task and scope, a sink that persists each chunk before
//! anyone sees it (G7), signals reported under its `WorkId`), a task as a
//! tracked future with its own token. The driver executes the core's orders
//! on a [`WorkHandle`]: cancel, close the stream, detach.

use crate::store_failures::{store_failure, StoreFailure, StoreFailures};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use settle_core::{CancelMode, TurnError, TurnErrorKind, WorkId};
use settle_store::{ChunkReceipt, NewChunk, SessionStore, StoreError};
use settle_stream::{
    Chunk, ChunkSink, Keyed, Provider, Request, Scope, SinkError, TurnOptions, Work, WorkControl,
    WorkSignal,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bus::EventBus;
use crate::chunk_append::{append_until_taken, NotAppended, Place};
use crate::chunk_queue::{chunk_queue, ChunkReceiver, ChunkSender};
use crate::command::WorkEnd;
use crate::event::LifecycleEvent;
use crate::shared::SessionShared;

/// The driver's grip on a work. Dropping it revokes the write access of a
/// work that has not reported its end.
pub(crate) struct WorkHandle {
    grip: Grip,
    /// The work reported its own end: what it still does (a task handing
    /// its caller its result) is not a late write (G10).
    reported_end: bool,
    /// Why it failed, as its last report said.
    pub error: Option<TurnError>,
    /// Who waits for its end.
    pub outcome: Option<oneshot::Sender<WorkEnd>>,
    /// When it was first cancelled (for the settle-time metric).
    pub cancelled_at: Option<std::time::Instant>,
    /// A turn's span, to record how it ended.
    pub span: Option<tracing::Span>,
    /// How many times a turn's opening was retried; its `Turn` reads it.
    pub retries: Arc<std::sync::atomic::AtomicU32>,
}

enum Grip {
    /// A turn: the stream crate's control (dropping it detaches).
    Turn(Option<WorkControl>),
    /// A task: its token, its revocation, its abort.
    Task {
        token: CancellationToken,
        revoked: CancellationToken,
        abort: AbortHandle,
    },
}

impl WorkHandle {
    /// A task's handle.
    pub fn task(
        token: CancellationToken,
        revoked: CancellationToken,
        abort: AbortHandle,
        outcome: oneshot::Sender<WorkEnd>,
    ) -> Self {
        WorkHandle {
            grip: Grip::Task {
                token,
                revoked,
                abort,
            },
            reported_end: false,
            error: None,
            outcome: Some(outcome),
            cancelled_at: None,
            span: None,
            retries: Arc::default(),
        }
    }

    /// Records on the turn's span how it ended (GenAI's `error.type`).
    pub fn ended(&self, outcome: settle_core::Outcome) {
        #[cfg(feature = "otel-genai")]
        if let (Some(span), Some(error)) = (&self.span, &self.error) {
            span.record("error.type", error.kind.as_str());
            span.record("otel.status_code", "ERROR");
        }
        #[cfg(feature = "otel-genai")]
        if let (Some(span), settle_core::Outcome::Detached) = (&self.span, outcome) {
            span.record("error.type", "detached");
            span.record("otel.status_code", "ERROR");
        }
        let _ = (&self.span, outcome);
    }

    /// The work reported its end (a task: its code returned or panicked,
    /// and it is handing its caller the result). Dropping the handle then
    /// revokes nothing: a revoke racing the hand-over refused a result
    /// that was not late (G10 is for detached work). A detach still
    /// revokes ([`detach`](Self::detach)).
    pub fn reported_end(&mut self) {
        self.reported_end = true;
    }

    /// An immediate cancel: the work's own token (which ends a turn's
    /// attached stream). Never sent twice (G6): the core says when.
    pub fn cancel(&mut self) {
        match &mut self.grip {
            Grip::Turn(Some(control)) => {
                let _ = control.cancel(CancelMode::Immediate);
            }
            Grip::Turn(None) => {}
            Grip::Task { token, .. } => token.cancel(),
        }
    }

    /// Closes the work's stream from outside, whatever the work is doing (G4).
    pub fn close_stream(&self) {
        if let Grip::Turn(Some(control)) = &self.grip {
            let _ = control.close_stream();
        }
    }

    /// Abandons the work (G5): its write access is revoked first, then its
    /// stream is force-closed and its task aborted.
    pub fn detach(&mut self) {
        match &mut self.grip {
            Grip::Turn(control) => {
                if let Some(control) = control.take() {
                    let _ = control.detach();
                }
            }
            Grip::Task { revoked, abort, .. } => {
                revoked.cancel();
                abort.abort();
            }
        }
    }
}

impl Drop for WorkHandle {
    fn drop(&mut self) {
        // A turn's control detaches on drop; a task's writes are revoked,
        // unless it ended by itself.
        if let (Grip::Task { revoked, .. }, false) = (&self.grip, self.reported_end) {
            revoked.cancel();
        }
    }
}

pub(crate) struct TurnContext<'a> {
    pub work: WorkId,
    pub provider: Arc<dyn Provider>,
    pub request: Request,
    /// Answered once the recorder has written the turn's start.
    pub started: oneshot::Receiver<Result<(), StoreError>>,
    pub shared: Arc<SessionShared>,
    pub reports: mpsc::UnboundedSender<(WorkId, WorkSignal)>,
    pub store: Arc<dyn SessionStore>,
    pub store_timeout: Duration,
    /// How long a cancelled turn's last chunk may keep its reader waiting
    /// for the store's answer (G5's bound).
    pub settle_timeout: Duration,
    pub failures: Arc<StoreFailures>,
    pub events: EventBus,
    pub options: TurnOptions,
    /// How many persisted chunks may wait for the consumer of the turn.
    pub chunk_buffer: usize,
    /// How many bytes of them.
    pub chunk_buffer_bytes: usize,
    pub tracker: &'a TaskTracker,
}

/// Starts a turn's work; returns the driver's handle and what the caller's
/// [`Turn`](crate::Turn) is made of.
pub(crate) fn spawn_turn(
    ctx: TurnContext<'_>,
) -> (
    WorkHandle,
    (WorkId, ChunkReceiver, oneshot::Receiver<WorkEnd>),
) {
    let TurnContext {
        work,
        provider,
        request,
        started,
        shared,
        reports,
        store,
        store_timeout,
        settle_timeout,
        failures,
        events,
        options,
        chunk_buffer,
        chunk_buffer_bytes,
        tracker,
    } = ctx;
    // Bounded in chunks and bytes: a consumer that reads slowly slows its
    // own turn, and memory stays flat.
    let (chunk_tx, chunks) = chunk_queue(chunk_buffer, chunk_buffer_bytes);
    let (outcome_tx, outcome) = oneshot::channel();
    #[cfg(not(feature = "otel-genai"))]
    let span = tracing::info_span!(parent: &shared.span, "turn", no = work.no);
    // GenAI conventions: a turn is the agent's invocation of its model.
    #[cfg(feature = "otel-genai")]
    let span = tracing::info_span!(
        parent: &shared.span,
        "turn",
        no = work.no,
        otel.name = %format!("invoke_agent {}", shared.name),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = "invoke_agent",
        gen_ai.agent.name = %shared.name,
        gen_ai.conversation.id = %work.session.0,
        gen_ai.provider.name = provider.name(),
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        error.type = tracing::field::Empty,
    );
    // The work's own scope: its token is the sink's cut, cancelled with the
    // work (no token of the runtime's own per turn). A stream that ended on
    // its own is waited for to close at most the settle timeout (G5).
    let scope = Scope::new().with_close_bound(settle_timeout);
    let sink = Persisting {
        cut: scope.token().clone(),
        settle_timeout,
        work,
        started: Some(started),
        store,
        store_timeout,
        failures,
        consumer: Some(chunk_tx),
        shared,
        events,
        seq: 0,
    };
    // The provider learns which session and turn it opens for.
    let control = Work::new(provider, request.for_turn(work))
        .options(options)
        .scope(scope)
        .span(span.clone())
        .spawn(tracker, sink, Keyed::new(work, reports));
    let handle = WorkHandle {
        grip: Grip::Turn(Some(control)),
        reported_end: false,
        error: None,
        outcome: Some(outcome_tx),
        cancelled_at: None,
        span: Some(span),
        retries: Arc::default(),
    };
    (handle, (work, chunks, outcome))
}

/// Persists each chunk and only then hands it on (G7). The stream crate
/// revokes it at a detach; the store refuses a write to a closed session or
/// turn (G10).
struct Persisting {
    work: WorkId,
    /// The turn's row: the work streams once it is committed.
    started: Option<oneshot::Receiver<Result<(), StoreError>>>,
    store: Arc<dyn SessionStore>,
    store_timeout: Duration,
    failures: Arc<StoreFailures>,
    consumer: Option<ChunkSender>,
    shared: Arc<SessionShared>,
    events: EventBus,
    seq: u32,
    /// The work's scope token, cancelled with the work: the chunk in flight
    /// then ends promptly.
    cut: CancellationToken,
    /// How long the chunk of an append in flight at a cancel may keep the
    /// reader's stream open, waiting for the store's answer.
    settle_timeout: Duration,
}

impl Persisting {
    fn failed(&self, message: String) -> SinkError {
        store_failure!(self.failures, StoreFailure::TurnStopped, warn, session = %self.work.session, %message, "stopping the turn");
        self.failures.add();
        self.events
            .emit(Some(&self.shared), || LifecycleEvent::StoreFailed {
                session: Some(self.work.session),
                message: message.clone(),
            });
        SinkError::Failed(TurnError::new(TurnErrorKind::Store, message))
    }
}

#[async_trait]
impl ChunkSink for Persisting {
    async fn begin(&mut self) -> Result<(), SinkError> {
        let Some(started) = self.started.take() else {
            return Ok(());
        };
        match started.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => {
                Err(self.failed(format!("could not record the turn's start: {error}")))
            }
            Err(_) => Err(SinkError::Closed),
        }
    }

    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError> {
        let place = Place {
            session: self.work.session,
            turn: self.work.no,
            seq: self.seq,
        };
        let make = || match chunk.as_text() {
            Some(text) => NewChunk::text(text),
            None => NewChunk::structured(chunk.kind(), chunk.to_json()),
        };
        let retrying = |error: &StoreError| {
            store_failure!(
                self.failures,
                StoreFailure::ChunkRetried,
                warn,
                session = %place.session,
                %error,
                "failed to persist a chunk; trying again until the store takes it"
            );
            self.events
                .emit(Some(&self.shared), || LifecycleEvent::StoreRetrying {
                    session: Some(place.session),
                    message: format!("failed to persist a chunk: {error}; trying again"),
                });
        };
        // A cancel drops this call wherever it is. An append already on its
        // way may be committed: its chunk goes to the reader once the store
        // says it is, after the chunks before it and before the turn's end
        // (the reader's stream ends only when every sender is gone), so the
        // reader of a cancelled turn gets every chunk the store has. A store
        // that does not answer within the settle timeout holds the reader
        // no longer (the exit bound of G9 counts it once).
        let consumer = &self.consumer;
        let settle = self.settle_timeout;
        let abandoned = |receipt: ChunkReceipt| {
            let (Some(consumer), Ok(runtime)) =
                (consumer.clone(), tokio::runtime::Handle::try_current())
            else {
                return;
            };
            let chunk = chunk.clone();
            runtime.spawn(async move {
                if let Ok(Ok(_)) = tokio::time::timeout(settle, receipt).await {
                    let _ = consumer.send_now(chunk);
                }
            });
        };
        let appended = tokio::time::Instant::now();
        let taken = append_until_taken(
            &*self.store,
            place,
            make,
            self.store_timeout,
            &self.cut,
            abandoned,
            retrying,
        )
        .await;
        match taken {
            Ok(()) => crate::meter::chunk_acked(appended.elapsed()),
            // A closed session or turn is revoked write access (G10), not a fault.
            Err(NotAppended::Closed) => return Err(SinkError::Closed),
            // Cancelled while the store failed: the turn ends cancelled.
            Err(NotAppended::Cancelled) => return Err(SinkError::Closed),
            Err(NotAppended::Failed(error)) => {
                return Err(self.failed(format!("could not persist a chunk: {error}")))
            }
            Err(NotAppended::Unanswered(after)) => {
                return Err(self.failed(format!(
                    "could not persist a chunk: the store did not answer within {after:?}"
                )));
            }
        }
        #[cfg(feature = "otel-genai")]
        if chunk.kind() == settle_core::ChunkKind::Usage {
            // The work runs in the turn's span.
            let usage = chunk.to_json();
            let span = tracing::Span::current();
            for (field, key) in [
                ("gen_ai.usage.input_tokens", "prompt_tokens"),
                ("gen_ai.usage.output_tokens", "completion_tokens"),
            ] {
                // As an i64: OpenTelemetry's integers are signed.
                if let Some(n) = usage.get(key).and_then(serde_json::Value::as_i64) {
                    span.record(field, n);
                }
            }
        }
        if let (Some(text), Some(sent)) = (chunk.as_text(), self.shared.sent().as_mut()) {
            // The reply as the store now has it, for the next turn's input.
            sent.reply_text(text);
        }
        let seq = self.seq;
        self.seq += 1;
        self.events
            .emit(Some(&self.shared), || LifecycleEvent::Chunk {
                session: self.work.session,
                turn: self.work.no,
                seq,
                chunk: chunk.clone(),
            });
        // A consumer that went away does not stop the turn: the
        // transcript is what matters, and it is persisted. One that is
        // there but slow is waited for (back-pressure), until the turn is
        // cancelled: then the chunk goes at once, so that the reader gets
        // every chunk that was stored.
        if let Some(consumer) = &self.consumer {
            if consumer.send(chunk, &self.cut).await.is_err() {
                self.consumer = None;
            }
        }
        Ok(())
    }
}
