//! The recorder: one task that applies the runtime's durable writes in the
//! order the core decided them (timeline, turn ends, finalize plans), so the
//! driver never waits on the store.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use settle_core::{Cause, Finalize, FinalizeStep, Outcome, SessionId, State, WorkId};
use settle_store::{Finalized, SessionStore};
use tokio::sync::{broadcast, mpsc, oneshot, OwnedSemaphorePermit};

use crate::command::Command;
use crate::hook::{self, SessionEnd, SessionEndHook};
use crate::{LifecycleEvent, ShutdownReport};

/// How many queued records the recorder takes per wake.
const RECORD_BATCH: usize = 256;

pub(crate) enum Record {
    Transition {
        session: SessionId,
        from: Option<State>,
        to: State,
        cause: Cause,
        at: SystemTime,
    },
    /// Written here, not by the work itself, so that it lands after the end
    /// of the session's previous turn (queued before it); `done` tells the
    /// work whether it may stream.
    StartTurn {
        work: WorkId,
        at: SystemTime,
        done: oneshot::Sender<Result<(), settle_store::StoreError>>,
    },
    EndTurn {
        work: WorkId,
        outcome: Outcome,
        at: SystemTime,
    },
    Detached {
        work: WorkId,
    },
    Flush,
    Finalize(Box<FinalizeJob>),
    ShutdownBegan {
        running: Vec<SessionId>,
    },
    /// Tell a waiter that a session is finalized, once every record before
    /// this one (its finalize plan among them) is applied.
    Notify {
        reply: oneshot::Sender<settle_core::EndReason>,
        reason: settle_core::EndReason,
    },
    ShutdownComplete {
        waiters: Vec<oneshot::Sender<ShutdownReport>>,
    },
}

pub(crate) struct FinalizeJob {
    pub plan: Finalize,
    pub name: Arc<str>,
    pub slot: Option<OwnedSemaphorePermit>,
    pub delegates: Vec<SessionId>,
    pub waiters: Vec<oneshot::Sender<settle_core::EndReason>>,
}

pub(crate) struct Recorder {
    pub store: Arc<dyn SessionStore>,
    pub hook: Option<Arc<dyn SessionEndHook>>,
    pub hook_timeout: Duration,
    pub flush_budget: Duration,
    pub events: broadcast::Sender<LifecycleEvent>,
    pub commands: mpsc::WeakUnboundedSender<Command>,
    pub failures: Arc<std::sync::atomic::AtomicUsize>,
    report: ShutdownReport,
    running_at_shutdown: Vec<SessionId>,
    shutting_down: bool,
}

impl Recorder {
    pub fn new(
        store: Arc<dyn SessionStore>,
        hook: Option<Arc<dyn SessionEndHook>>,
        config: &crate::Config,
        events: broadcast::Sender<LifecycleEvent>,
        commands: mpsc::WeakUnboundedSender<Command>,
        failures: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Self {
        Recorder {
            store,
            hook,
            hook_timeout: config.hook_timeout,
            flush_budget: config.flush_budget,
            events,
            commands,
            failures,
            report: ShutdownReport::default(),
            running_at_shutdown: Vec::new(),
            shutting_down: false,
        }
    }

    pub async fn run(mut self, mut records: mpsc::UnboundedReceiver<Record>) {
        // Everything already queued is applied per wake: a teardown queues
        // several records per session, and waking once per record costs more
        // than applying them.
        let mut batch = Vec::with_capacity(RECORD_BATCH);
        while records.recv_many(&mut batch, RECORD_BATCH).await > 0 {
            for record in batch.drain(..) {
                self.apply(record).await;
            }
        }
    }

    async fn apply(&mut self, record: Record) {
        match record {
            Record::Transition {
                session,
                from,
                to,
                cause,
                at,
            } => {
                if cause == Cause::DrainEnded {
                    self.report.cancelled.push(session);
                }
                // Registration wrote the row, and the finalize latch writes the
                // last transition itself (G2): only the ones between go here.
                let Some(from) = from else { return };
                if to == State::Finalized {
                    return;
                }
                let cause = cause.to_string();
                let result = self.store.transition(session, from, to, &cause, at).await;
                self.check(Some(session), "record a transition", result);
            }
            Record::StartTurn { work, at, done } => {
                let result = self
                    .store
                    .start_turn(work.session, work.turn, None, at)
                    .await;
                let _ = done.send(result.clone());
                self.check(Some(work.session), "start a turn", result);
            }
            Record::EndTurn { work, outcome, at } => {
                if self.shutting_down
                    && outcome == Outcome::Completed
                    && self.running_at_shutdown.contains(&work.session)
                {
                    self.report.drained.push(work.session);
                }
                let result = self
                    .store
                    .end_turn(work.session, work.turn, outcome, None, at)
                    .await;
                self.check(Some(work.session), "end a turn", result);
            }
            Record::Detached { work } => self.report.detached.push(work.session),
            Record::Flush => {
                let flushed = tokio::time::timeout(self.flush_budget, self.store.flush()).await;
                self.report.flushed_in_budget = match flushed {
                    Ok(result) => self.check(None, "flush transcripts", result).is_some(),
                    Err(_) => {
                        tracing::warn!(budget = ?self.flush_budget, "transcript flush overran its budget");
                        false
                    }
                };
            }
            Record::Finalize(job) => self.finalize(*job).await,
            Record::Notify { reply, reason } => {
                let _ = reply.send(reason);
            }
            Record::ShutdownBegan { running } => {
                self.shutting_down = true;
                self.running_at_shutdown = running;
            }
            Record::ShutdownComplete { waiters } => {
                let mut report = std::mem::take(&mut self.report);
                report.store_failures = self.failures.load(std::sync::atomic::Ordering::Relaxed);
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
            name,
            mut slot,
            delegates,
            waiters,
        } = job;
        let session = plan.session;
        let mut memory_committed = false;
        for step in Finalize::PLAN {
            match step {
                FinalizeStep::PersistTranscript => {
                    let result = self.store.flush().await;
                    self.check(Some(session), "persist the transcript", result);
                }
                // Committed inside the latch's transaction, so memory is never
                // committed for a session someone else finalized (G2, G7).
                FinalizeStep::CommitMemory => {}
                FinalizeStep::EndRow => {
                    let mut request = settle_store::Finalize::new(plan.reason)
                        .commit_memory(plan.commit_memory)
                        .at(std::time::SystemTime::now());
                    if let Some(outcome) = plan.last_outcome {
                        request = request.with_outcome(outcome);
                    }
                    let result = self.store.finalize(session, request).await;
                    match self.check(Some(session), "end the durable row", result) {
                        Some(Finalized::Won(report)) => {
                            memory_committed = report.memories > 0;
                            for failed in &report.failed_steps {
                                tracing::warn!(%session, step = failed.step.as_str(), error = %failed.error, "finalize step failed; the rest ran");
                            }
                        }
                        Some(Finalized::AlreadyFinalized) => {
                            tracing::warn!(%session, "the durable row was already finalized elsewhere");
                        }
                        None => {
                            if self.shutting_down {
                                self.report.left_recoverable.push(session);
                            }
                        }
                    }
                }
                FinalizeStep::EndHook => {
                    if let Some(hook) = &self.hook {
                        let end = SessionEnd {
                            session,
                            name: name.to_string(),
                            reason: plan.reason,
                            completed: plan.completed(),
                            interrupted: plan.interrupted(),
                        };
                        if let Err(failure) = hook::fire(hook.clone(), end, self.hook_timeout).await
                        {
                            tracing::warn!(%session, ?failure, "on_session_end hook failed; carrying on");
                        }
                    }
                }
                FinalizeStep::ReleaseSlot => drop(slot.take()),
                FinalizeStep::InterruptDelegations => {
                    if let Some(commands) = self.commands.upgrade() {
                        for delegate in &delegates {
                            let event = settle_core::Event::Cancel {
                                session: *delegate,
                                mode: settle_core::CancelMode::Immediate,
                            };
                            let _ = commands.send(Command::Core { event, reply: None });
                        }
                    }
                }
            }
        }
        if self.shutting_down {
            self.report.finalized.push((session, plan.reason));
        }
        let _ = self.events.send(LifecycleEvent::Finalized {
            session,
            reason: plan.reason,
            memory_committed,
        });
        for waiter in waiters {
            let _ = waiter.send(plan.reason);
        }
    }

    fn check<T>(
        &mut self,
        session: Option<SessionId>,
        what: &str,
        result: Result<T, settle_store::StoreError>,
    ) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                self.failures
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::error!(?session, %error, "failed to {what}");
                let _ = self.events.send(LifecycleEvent::StoreFailed {
                    session,
                    message: format!("failed to {what}: {error}"),
                });
                None
            }
        }
    }
}
