//! The recorder: one task that applies the kernel's durable writes in the
//! order the core decided them (rows, timeline, turns, finalize plans), so the
//! driver never waits on the store, and answers whoever waits for a write only
//! once it is committed (G7).
//!
//! Every store call is bounded: by the store timeout, and once a shutdown has
//! begun by what is left of its budget (drain + settle timeout + flush budget),
//! so that a store that stops answering cannot hold the process (G9). What
//! could not be committed in time is left for recovery (G8) and named in the
//! [`ShutdownReport`].

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use settle_core::{Finalize, FinalizeStep, SessionId, State};
use settle_store::{Finalized, NewSession, OwnerId, SessionStore, StoreError};
use tokio::sync::mpsc;

use crate::command::{Ack, Command};
use crate::event::EventBus;
use crate::hook::{HookRunner, SessionEnd};
use crate::record::{FinalizeJob, Record};
use crate::{LifecycleEvent, RuntimeError, ShutdownReport};

/// How many queued records the recorder takes per wake.
const RECORD_BATCH: usize = 1024;

/// Why a bounded store call gave no answer.
#[derive(Debug)]
pub(crate) enum Unwritten {
    Failed(StoreError),
    TimedOut(Duration),
}

impl Unwritten {
    pub fn into_error(self, what: &'static str) -> RuntimeError {
        match self {
            Unwritten::Failed(error) => error.into(),
            Unwritten::TimedOut(after) => RuntimeError::StoreTimeout { what, after },
        }
    }
}

impl std::fmt::Display for Unwritten {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unwritten::Failed(error) => error.fmt(f),
            Unwritten::TimedOut(after) => write!(f, "the store did not answer within {after:?}"),
        }
    }
}

pub(crate) struct Recorder {
    pub store: Arc<dyn SessionStore>,
    pub owner: OwnerId,
    pub hooks: HookRunner,
    /// The works' tracker, to count what outlives the shutdown.
    pub works: tokio_util::task::TaskTracker,
    pub store_timeout: Duration,
    pub events: EventBus,
    pub acks: mpsc::UnboundedSender<Ack>,
    pub commands: mpsc::WeakUnboundedSender<Command>,
    pub failures: Arc<AtomicUsize>,
    pub report: ShutdownReport,
    /// Once a shutdown began: when its budget runs out.
    pub deadline: Option<tokio::time::Instant>,
    /// Where the final report is kept for late askers.
    pub last_report: Arc<std::sync::OnceLock<ShutdownReport>>,
}

impl Recorder {
    pub async fn run(mut self, mut records: mpsc::UnboundedReceiver<Record>) {
        let mut batch = Vec::with_capacity(RECORD_BATCH);
        while records.recv_many(&mut batch, RECORD_BATCH).await > 0 {
            for record in batch.drain(..) {
                self.apply(record).await;
            }
        }
    }

    /// Runs a store call within its bound.
    async fn bounded<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, Unwritten> {
        let bound = match self.deadline {
            Some(deadline) => deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .min(self.store_timeout),
            None => self.store_timeout,
        };
        match tokio::time::timeout(bound, call).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(error)) => Err(Unwritten::Failed(error)),
            Err(_) => Err(Unwritten::TimedOut(bound)),
        }
    }

    async fn apply(&mut self, record: Record) {
        match record {
            Record::ReserveIds { count } => {
                let ack = match self.bounded(self.store.reserve_ids(count)).await {
                    Ok(range) => Ack::Ids(range),
                    Err(Unwritten::Failed(error)) => Ack::IdsFailed(error),
                    Err(Unwritten::TimedOut(_)) => Ack::IdsFailed(StoreError::Unavailable),
                };
                let _ = self.acks.send(ack);
            }
            Record::CreateSession { shared, at, reply } => {
                let mut new = NewSession::new(shared.name.to_string(), self.owner)
                    .with_id(shared.id)
                    .at(at);
                new.parent = shared.parent;
                match self.bounded(self.store.create_session(new)).await {
                    Ok(_) => {
                        let _ = reply.send(Ok(shared));
                    }
                    Err(unwritten) => {
                        self.failed(Some(shared.id), "register a session", &unwritten);
                        let _ = reply.send(Err(unwritten.into_error("registering a session")));
                        let _ = self.acks.send(Ack::RegisterFailed(shared.id));
                    }
                }
            }
            Record::Transition { transition: t, at } => {
                // Registration wrote the row, and the finalize latch writes the
                // last transition itself (G2): only the ones between go here.
                let Some(from) = t.from else { return };
                if t.to == State::Finalized {
                    return;
                }
                let cause = t.cause.to_string();
                let written = self
                    .bounded(self.store.transition(t.session, from, t.to, &cause, at))
                    .await;
                if let Err(unwritten) = written {
                    self.failed(Some(t.session), "record a transition", &unwritten);
                }
            }
            Record::StartTurn {
                work,
                at,
                input: _,
                done,
            } => {
                let written = self
                    .bounded(self.store.start_turn(work.session, work.no, at))
                    .await;
                let answer = match written {
                    Ok(()) => Ok(()),
                    Err(unwritten) => {
                        self.failed(Some(work.session), "start a turn", &unwritten);
                        Err(match unwritten {
                            Unwritten::Failed(error) => error,
                            Unwritten::TimedOut(_) => StoreError::Unavailable,
                        })
                    }
                };
                let _ = done.send(answer);
            }
            Record::EndTurn {
                work,
                outcome,
                error,
                at,
                notify,
            } => {
                if work.turn_no().is_some() {
                    let written = self
                        .bounded(self.store.end_turn(work.session, work.no, outcome, at))
                        .await;
                    if let Err(unwritten) = written {
                        self.failed(Some(work.session), "end a turn", &unwritten);
                    }
                }
                if let Some(notify) = notify {
                    let _ = notify.send((outcome, error));
                }
            }
            Record::Flush => {
                self.report.flushed_in_budget = match self.bounded(self.store.flush()).await {
                    Ok(()) => true,
                    Err(unwritten) => {
                        self.failed(None, "flush transcripts", &unwritten);
                        false
                    }
                };
            }
            Record::Finalize(job) => {
                let span = match &job.shared {
                    Some(shared) => {
                        tracing::info_span!(parent: &shared.span, "finalize", reason = %job.plan.reason)
                    }
                    None => tracing::Span::none(),
                };
                tracing::Instrument::instrument(self.finalize(*job), span).await;
            }
            Record::ShutdownBegan { deadline } => self.deadline = Some(deadline),
            Record::ShutdownComplete {
                summary,
                waiters,
                lease_lost,
            } => {
                let until = self
                    .deadline
                    .unwrap_or_else(|| tokio::time::Instant::now() + self.store_timeout);
                let mut report = std::mem::take(&mut self.report);
                report.hooks_abandoned = self.hooks.settle(until).await;
                report.works_abandoned = self.works.len();
                report.drained = summary.drained;
                report.cancelled = summary.cancelled;
                report.detached = summary.detached.iter().map(|w| w.session).collect();
                report.store_failures = self.failures.load(Ordering::Relaxed);
                report.lease_lost = lease_lost;
                let _ = self.last_report.set(report.clone());
                for waiter in waiters {
                    let _ = waiter.send(report.clone());
                }
            }
        }
    }

    /// The finalize plan of SPEC §4: each step best-effort, in order.
    async fn finalize(&mut self, job: FinalizeJob) {
        let FinalizeJob {
            plan,
            at,
            shared,
            mut slot,
            delegates,
        } = job;
        let session = plan.session;
        let mut memory_committed = false;
        for step in Finalize::PLAN {
            match step {
                // The store's writer applies writes in order: every chunk
                // appended before this plan is committed before its latch.
                FinalizeStep::PersistTranscript => {}
                // Committed inside the latch's transaction, so memory is never
                // committed for a session someone else finalized (G2, G7).
                FinalizeStep::CommitMemory => {}
                FinalizeStep::EndRow => {
                    let mut request = settle_store::Finalize::new(plan.reason)
                        .commit_memory(plan.commit_memory)
                        .at(at);
                    if let Some(outcome) = plan.last_outcome {
                        request = request.with_outcome(outcome);
                    }
                    match self.bounded(self.store.finalize(session, request)).await {
                        Ok(Finalized::Won(report)) => {
                            memory_committed = report.memories > 0;
                            for failed in &report.failed_steps {
                                tracing::warn!(%session, step = failed.step.as_str(), error = %failed.error, "finalize step failed; the rest ran");
                            }
                        }
                        Ok(Finalized::AlreadyFinalized) => {
                            tracing::warn!(%session, "the durable row was already finalized elsewhere");
                        }
                        Err(unwritten) => {
                            self.failed(Some(session), "end the durable row", &unwritten);
                            if self.deadline.is_some() {
                                self.report.left_recoverable.push(session);
                            }
                        }
                    }
                }
                FinalizeStep::EndHook => {
                    let name = shared
                        .as_ref()
                        .map(|s| s.name.to_string())
                        .unwrap_or_default();
                    let span = shared.as_ref().map(|s| s.span.clone());
                    self.hooks.fire(
                        span,
                        SessionEnd {
                            session,
                            name,
                            reason: plan.reason,
                            completed: plan.completed(),
                            interrupted: plan.interrupted(),
                        },
                    );
                }
                FinalizeStep::ReleaseSlot => drop(slot.take()),
                FinalizeStep::InterruptDelegations => self.interrupt(&delegates),
            }
        }
        if self.deadline.is_some() {
            self.report.finalized.push((session, plan.reason));
        }
        self.events
            .emit(shared.as_deref(), || LifecycleEvent::Finalized {
                session,
                reason: plan.reason,
                memory_committed,
            });
        if let Some(shared) = shared {
            shared.set_finalized(plan.reason);
        }
    }

    fn interrupt(&self, delegates: &[SessionId]) {
        let Some(commands) = self.commands.upgrade() else {
            return;
        };
        for delegate in delegates {
            let event = settle_core::Event::Cancel {
                session: *delegate,
                mode: settle_core::CancelMode::Immediate,
            };
            let _ = commands.send(Command::Core { event, reply: None });
        }
    }

    fn failed(&self, session: Option<SessionId>, what: &str, unwritten: &Unwritten) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        tracing::error!(?session, error = %unwritten, "failed to {what}");
        self.events.emit(None, || LifecycleEvent::StoreFailed {
            session,
            message: format!("failed to {what}: {unwritten}"),
        });
    }
}
