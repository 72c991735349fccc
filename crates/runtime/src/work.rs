//! The work of one turn: a tokio task that opens the provider's stream inside
//! the turn's cancellation scope and persists each chunk before the consumer
//! sees it (G7).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use settle_core::{Outcome, WorkId};
use settle_store::{SessionStore, StoreError};
use settle_stream::{
    run_turn, ChunkSink, Provider, ProviderStream, Request, Scope, SinkClosed, StreamError,
    TurnOptions,
};
use tokio::sync::{broadcast, mpsc, oneshot};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use crate::command::{WorkReport, WorkReportKind};
use crate::{LifecycleEvent, Turn};

/// The driver's grip on a work.
pub(crate) struct WorkHandle {
    pub scope: Scope,
    pub outcome: Option<oneshot::Sender<Outcome>>,
    revoked: CancellationToken,
    task: AbortHandle,
}

impl WorkHandle {
    /// Abandons the work (G5): its write access is revoked first, then its
    /// stream is force-closed and its task aborted.
    pub fn detach(&mut self) {
        self.revoked.cancel();
        self.scope.close_handle().close();
        self.task.abort();
    }
}

pub(crate) struct WorkContext<'a> {
    pub work: WorkId,
    pub provider: Arc<dyn Provider>,
    pub request: Request,
    /// Answered once the recorder has written the turn's start.
    pub started: oneshot::Receiver<Result<(), settle_store::StoreError>>,
    pub session_token: &'a CancellationToken,
    pub store: Arc<dyn SessionStore>,
    pub reports: mpsc::UnboundedSender<WorkReport>,
    pub events: broadcast::Sender<LifecycleEvent>,
    pub failures: Arc<std::sync::atomic::AtomicUsize>,
    pub idle_timeout: Option<Duration>,
}

pub(crate) fn spawn(ctx: WorkContext<'_>) -> (WorkHandle, Turn) {
    let WorkContext {
        work,
        provider,
        request,
        started,
        session_token,
        store,
        reports,
        events,
        failures,
        idle_timeout,
    } = ctx;
    // A child of the session's scope: born cancelled if the session already is.
    let scope = Scope::new(session_token);
    let (chunk_tx, chunks) = mpsc::unbounded_channel();
    let (outcome_tx, outcome) = oneshot::channel();
    let revoked = CancellationToken::new();
    let options = TurnOptions {
        idle_timeout: idle_timeout.unwrap_or(Duration::ZERO),
        first_event_timeout: None,
    };
    let task = {
        let scope = scope.clone();
        let revoked = revoked.clone();
        tokio::spawn(async move {
            let report = |kind| {
                let _ = reports.send(WorkReport { work, kind });
            };
            let started = started
                .await
                .unwrap_or(Err(settle_store::StoreError::Unavailable));
            let outcome = match started {
                Err(error) => {
                    tracing::error!(session = %work.session, %error, "could not record the turn's start");
                    Outcome::Failed
                }
                Ok(()) => {
                    let provider = Reporting {
                        inner: provider,
                        reports: reports.clone(),
                        work,
                    };
                    let mut sink = Persisting {
                        work,
                        store_failed: false,
                        store,
                        revoked,
                        consumer: Some(chunk_tx),
                        events,
                        failures,
                        seq: 0,
                    };
                    let end = run_turn(&provider, &request, &scope, &mut sink, options).await;
                    report(WorkReportKind::StreamClosed);
                    // Stopped because the store failed a write: the turn
                    // failed, it was not cancelled.
                    if sink.store_failed {
                        Outcome::Failed
                    } else {
                        end.outcome()
                    }
                }
            };
            report(WorkReportKind::Ended(outcome));
        })
        .abort_handle()
    };
    let handle = WorkHandle {
        scope,
        outcome: Some(outcome_tx),
        revoked,
        task,
    };
    (
        handle,
        Turn {
            work,
            chunks,
            outcome,
        },
    )
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
    store_failed: bool,
    store: Arc<dyn SessionStore>,
    revoked: CancellationToken,
    consumer: Option<mpsc::UnboundedSender<String>>,
    events: broadcast::Sender<LifecycleEvent>,
    failures: Arc<std::sync::atomic::AtomicUsize>,
    seq: u32,
}

#[async_trait]
impl ChunkSink for Persisting {
    async fn chunk(&mut self, text: String) -> Result<(), SinkClosed> {
        if self.revoked.is_cancelled() {
            return Err(SinkClosed);
        }
        let appended = tokio::select! {
            biased;
            () = self.revoked.cancelled() => return Err(SinkClosed),
            appended = self.store.append_chunk(self.work.session, self.work.turn, text.clone().into()) => appended,
        };
        if let Err(error) = appended {
            tracing::warn!(session = %self.work.session, %error, "chunk refused by the store; stopping the turn");
            // A closed session or turn is revoked write access (G10), not a
            // fault; anything else is a failed write, counted and shown like
            // the recorder's.
            if !matches!(
                error,
                StoreError::SessionClosed(_) | StoreError::TurnClosed { .. }
            ) {
                self.store_failed = true;
                self.failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let _ = self.events.send(LifecycleEvent::StoreFailed {
                    session: Some(self.work.session),
                    message: format!("failed to persist a chunk: {error}"),
                });
            }
            return Err(SinkClosed);
        }
        let _ = self.events.send(LifecycleEvent::Chunk {
            session: self.work.session,
            turn: self.work.turn,
            seq: self.seq,
            text: text.clone(),
        });
        self.seq += 1;
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
