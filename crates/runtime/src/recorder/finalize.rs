//! The finalize plan of SPEC §4 as the recorder runs it, once the row's
//! latch was committed (or could not be): the end hook, the shutdown
//! report's part, the `Finalized` event and the handles' end.

use settle_core::{Finalize, FinalizeStep};
use settle_store::{Applied, Finalized};

use super::unwritten::Unwritten;
use super::Recorder;
use crate::event::LifecycleEvent;
use crate::hook::SessionEnd;
use crate::record::FinalizeJob;

impl Recorder {
    /// The rest of the finalize plan of SPEC §4, once the row's latch was
    /// committed (or could not be): each step best-effort, in order.
    pub(super) fn finalized(&mut self, job: FinalizeJob, result: Result<Applied, Unwritten>) {
        let FinalizeJob {
            plan,
            shared,
            tried_again,
            withdrawn,
            ..
        } = job;
        let session = plan.session;
        let span = match &shared {
            Some(shared) => {
                tracing::info_span!(parent: &shared.span, "finalize", reason = %plan.reason)
            }
            None => tracing::Span::none(),
        };
        let _entered = span.enter();
        let mut memory_committed = false;
        for step in Finalize::PLAN {
            match step {
                // The store's writer applies writes in order: every chunk
                // appended before this plan was committed before its latch.
                FinalizeStep::PersistTranscript => {}
                // Committed inside the latch's transaction, so memory is never
                // committed for a session someone else finalized (G2, G7).
                FinalizeStep::CommitMemory => {}
                FinalizeStep::EndRow => match &result {
                    Ok(Applied::Finalized(Finalized::Won(report))) => {
                        memory_committed = report.memories > 0;
                        for failed in &report.failed_steps {
                            tracing::warn!(%session, step = failed.step.as_str(), error = %failed.error, "finalize step failed; the rest ran");
                        }
                    }
                    // Tried again after an earlier try got no answer (the
                    // store timeout, a connection lost at its commit), the
                    // row found ended was ended by that try: writes are
                    // fenced per writer, so no other process ends a row
                    // this one owns while its lease is live (G8, G12).
                    Ok(_) if withdrawn => tracing::debug!(
                        %session,
                        "its registration was refused and withdrawn: the store has no row to end, or ended it as failed"
                    ),
                    Ok(_) if tried_again => tracing::debug!(
                        %session,
                        "the durable row was ended by an earlier try of this finalize"
                    ),
                    Ok(_) => {
                        tracing::warn!(%session, "the durable row was already finalized elsewhere");
                    }
                    Err(unwritten) => {
                        self.failed(Some(session), "end the durable row", unwritten);
                        // Left live in the store, whenever it was decided:
                        // before the shutdown too (its end waiting for a
                        // store that came back too late, or never).
                        self.report.left_recoverable.push(session);
                    }
                },
                FinalizeStep::EndHook if self.hooks.is_set() => {
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
                            row_ended: result.is_ok(),
                        },
                    );
                }
                // No hook is set: nothing to fire.
                FinalizeStep::EndHook => {}
                // The core freed the slot and interrupted the delegations
                // when it ordered the plan (steps 5 and 6 are its decisions).
                FinalizeStep::ReleaseSlot | FinalizeStep::InterruptDelegations => {}
            }
        }
        // A finalize the store did not commit is named in `left_recoverable`
        // only: the report says what the store holds, not what was asked.
        if plan.in_shutdown && result.is_ok() {
            self.report.finalized.push((session, plan.reason));
        }
        // Nobody is told a session was finalized whose row was not ended.
        if result.is_err() {
            if let Some(shared) = shared {
                shared.set_unwritten();
            }
            return;
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
}
