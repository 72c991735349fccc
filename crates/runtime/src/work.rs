//! The work of one turn: a tracked tokio task that opens the provider's
//! stream inside the work's own cancellation scope, persists each chunk
//! before the consumer sees it (G7), and reports its stream and its end to
//! the driver under its `WorkId`. The driver holds a [`WorkHandle`] and
//! executes the core's orders on it: cancel, close the stream, detach.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use settle_core::{Outcome, TurnError, TurnErrorKind, WorkId};
use settle_store::{SessionStore, StoreError};
use settle_stream::{
    run_turn, ChunkSink, Provider, ProviderStream, Request, Scope, SinkClosed, StreamError,
    TurnEnd, TurnOptions,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::command::{WorkReport, WorkReportKind};
use crate::event::EventBus;
use crate::shared::SessionShared;
use crate::{LifecycleEvent, Turn};

/// The driver's grip on a work. Dropping it revokes the work's write access.
pub(crate) struct WorkHandle {
    /// The work's own cancellation token.
    token: CancellationToken,
    /// What closes a turn's stream from outside (none for a task).
    stream: Option<Scope>,
    revoked: CancellationToken,
    task: AbortHandle,
    /// Why it failed, as its last report said.
    pub error: Option<TurnError>,
    /// Who waits for its end.
    pub outcome: Option<oneshot::Sender<crate::command::WorkEnd>>,
}

impl WorkHandle {
    /// A task's handle: its token, its revocation, its abort.
    pub fn task(
        token: CancellationToken,
        revoked: CancellationToken,
        task: AbortHandle,
        outcome: oneshot::Sender<crate::command::WorkEnd>,
    ) -> Self {
        WorkHandle {
            token,
            stream: None,
            revoked,
            task,
            error: None,
            outcome: Some(outcome),
        }
    }

    /// An immediate cancel: the work's token (which ends a turn's attached stream).
    pub fn cancel(&self) {
        self.token.cancel();
    }

    /// Closes the work's stream from outside, whatever the work is doing (G4).
    pub fn close_stream(&self) {
        if let Some(scope) = &self.stream {
            scope.close_handle().close();
        }
    }

    /// Abandons the work (G5): its write access is revoked first, then its
    /// stream is force-closed and its task aborted.
    pub fn detach(&mut self) {
        self.revoked.cancel();
        self.close_stream();
        self.task.abort();
    }
}

impl Drop for WorkHandle {
    fn drop(&mut self) {
        self.revoked.cancel();
    }
}

pub(crate) struct WorkContext<'a> {
    pub work: WorkId,
    pub provider: Arc<dyn Provider>,
    pub request: Request,
    /// Answered once the recorder has written the turn's start.
    pub started: oneshot::Receiver<Result<(), StoreError>>,
    pub shared: Arc<SessionShared>,
    pub reports: mpsc::UnboundedSender<WorkReport>,
    pub store: Arc<dyn SessionStore>,
    pub store_timeout: Duration,
    pub failures: Arc<AtomicUsize>,
    pub events: EventBus,
    pub idle_timeout: Option<Duration>,
    pub tracker: &'a TaskTracker,
}

/// The messages sent to the provider, as the store keeps a turn's input.
pub(crate) fn input_json(request: &Request) -> String {
    let messages: Vec<serde_json::Value> = request
        .messages
        .iter()
        .map(|m| serde_json::json!({ "role": m.role.as_str(), "content": m.content }))
        .collect();
    serde_json::Value::Array(messages).to_string()
}

pub(crate) fn spawn(ctx: WorkContext<'_>) -> (WorkHandle, Turn) {
    let WorkContext {
        work,
        provider,
        request,
        started,
        shared,
        reports,
        store,
        store_timeout,
        failures,
        events,
        idle_timeout,
        tracker,
    } = ctx;
    let scope = Scope::new(&CancellationToken::new());
    let (chunk_tx, chunks) = mpsc::unbounded_channel();
    let (outcome_tx, outcome) = oneshot::channel();
    let revoked = CancellationToken::new();
    let options = TurnOptions {
        idle_timeout: idle_timeout.unwrap_or(Duration::ZERO),
        first_event_timeout: None,
    };
    let span = tracing::info_span!(parent: &shared.span, "turn", no = work.no);
    let body = {
        let (scope, revoked, reports) = (scope.clone(), revoked.clone(), reports.clone());
        async move {
            let started = started.await.unwrap_or(Err(StoreError::Unavailable));
            if let Err(error) = started {
                tracing::error!(%error, "could not record the turn's start");
                let error = TurnError::new(
                    TurnErrorKind::Store,
                    format!("could not record the turn's start: {error}"),
                );
                return (Outcome::Failed, Some(error));
            }
            let provider = Reporting {
                inner: provider,
                reports: reports.clone(),
                work,
            };
            let mut sink = Persisting {
                work,
                store_failed: None,
                store,
                store_timeout,
                failures,
                revoked,
                consumer: Some(chunk_tx),
                shared,
                events,
                seq: 0,
            };
            let end = run_turn(&provider, &request, &scope, &mut sink, options).await;
            let _ = reports.send(WorkReport {
                work,
                kind: WorkReportKind::StreamClosed,
            });
            // Stopped because the store failed a write: the turn failed, it
            // was not cancelled.
            if let Some(error) = sink.store_failed {
                return (Outcome::Failed, Some(error));
            }
            (end.outcome(), turn_error(&end))
        }
    };
    let task = tracker
        .spawn(
            async move {
                // A panic anywhere in the work still ends it, once, as failed.
                let (outcome, error) = match std::panic::AssertUnwindSafe(body).catch_unwind().await
                {
                    Ok(end) => end,
                    Err(panic) => (
                        Outcome::Failed,
                        Some(panicked(panic.as_ref(), "the turn's work panicked")),
                    ),
                };
                let _ = reports.send(WorkReport {
                    work,
                    kind: WorkReportKind::Ended { outcome, error },
                });
            }
            .instrument(span),
        )
        .abort_handle();
    let handle = WorkHandle {
        token: scope.token().clone(),
        stream: Some(scope),
        revoked,
        task,
        error: None,
        outcome: Some(outcome_tx),
    };
    (handle, Turn::new(work, chunks, outcome))
}

/// The error of a turn that did not complete, in words a person can act on.
fn turn_error(end: &TurnEnd) -> Option<TurnError> {
    match end {
        TurnEnd::Failed(error) => Some(stream_error(error)),
        TurnEnd::IdleTimeout(error) => {
            Some(TurnError::new(TurnErrorKind::Timeout, error.to_string()))
        }
        TurnEnd::Panicked => Some(TurnError::new(
            TurnErrorKind::Panic,
            "the turn's work panicked",
        )),
        _ => None,
    }
}

fn stream_error(error: &StreamError) -> TurnError {
    use settle_stream::StreamErrorKind as K;
    let kind = match error.kind() {
        K::Status { .. } => TurnErrorKind::HttpStatus,
        K::Http { .. } => TurnErrorKind::Connect,
        K::HeadersTimeout { .. } | K::IdleTimeout(_) | K::FirstEventTimeout(_) => {
            TurnErrorKind::Timeout
        }
        K::Protocol(_) => TurnErrorKind::Protocol,
        _ => TurnErrorKind::Provider,
    };
    TurnError::new(kind, error.to_string())
}

/// The error of a work that panicked, with the panic's message.
pub(crate) fn panicked(panic: &(dyn std::any::Any + Send), what: &str) -> TurnError {
    let message = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned());
    TurnError::new(TurnErrorKind::Panic, format!("{what}: {message}"))
}

/// Tells the core when the stream exists, so a cancel that raced the attach
/// still closes it (G4; the scope closes it too, by construction).
struct Reporting {
    inner: Arc<dyn Provider>,
    reports: mpsc::UnboundedSender<WorkReport>,
    work: WorkId,
}

#[async_trait]
impl Provider for Reporting {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        let stream = self.inner.open(request).await?;
        let _ = self.reports.send(WorkReport {
            work: self.work,
            kind: WorkReportKind::StreamAttached,
        });
        Ok(stream)
    }
}

/// Persists each chunk and only then hands it on (G7). Refuses once the work
/// is detached, and when the store says the session or turn is closed (G10).
struct Persisting {
    work: WorkId,
    /// A chunk write failed (not a revoked write): the turn ends `failed`.
    store_failed: Option<TurnError>,
    store: Arc<dyn SessionStore>,
    store_timeout: Duration,
    failures: Arc<AtomicUsize>,
    revoked: CancellationToken,
    consumer: Option<mpsc::UnboundedSender<String>>,
    shared: Arc<SessionShared>,
    events: EventBus,
    seq: u32,
}

#[async_trait]
impl ChunkSink for Persisting {
    async fn chunk(&mut self, text: String) -> Result<(), SinkClosed> {
        if self.revoked.is_cancelled() {
            return Err(SinkClosed);
        }
        let receipt = self
            .store
            .append_chunk(self.work.session, self.work.no, text.clone());
        let appended = tokio::select! {
            biased;
            () = self.revoked.cancelled() => return Err(SinkClosed),
            appended = tokio::time::timeout(self.store_timeout, receipt) => appended,
        };
        let failure = match appended {
            Ok(Ok(_)) => None,
            // A closed session or turn is revoked write access (G10), not a fault.
            Ok(Err(StoreError::SessionClosed(_) | StoreError::TurnClosed { .. })) => {
                return Err(SinkClosed)
            }
            Ok(Err(error)) => Some(format!("could not persist a chunk: {error}")),
            Err(_) => Some(format!(
                "could not persist a chunk: the store did not answer within {:?}",
                self.store_timeout
            )),
        };
        if let Some(message) = failure {
            tracing::warn!(%message, "stopping the turn");
            self.failures.fetch_add(1, Ordering::Relaxed);
            self.events
                .emit(Some(&self.shared), || LifecycleEvent::StoreFailed {
                    session: Some(self.work.session),
                    message: message.clone(),
                });
            self.store_failed = Some(TurnError::new(TurnErrorKind::Store, message));
            return Err(SinkClosed);
        }
        let seq = self.seq;
        self.seq += 1;
        self.events
            .emit(Some(&self.shared), || LifecycleEvent::Chunk {
                session: self.work.session,
                turn: self.work.no,
                seq,
                text: text.clone(),
            });
        // A consumer that stopped reading does not stop the turn: the
        // transcript is what matters, and it is persisted.
        if let Some(consumer) = &self.consumer {
            if consumer.send(text).is_err() {
                self.consumer = None;
            }
        }
        Ok(())
    }
}
