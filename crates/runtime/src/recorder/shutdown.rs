//! The shutdown report as the recorder completes it: whether the flush
//! committed every transcript within its budget, and, once every session is
//! finalized, what the shutdown did, handed to its waiters and kept for late
//! askers. (Each finalize adds its session to it in `finalize.rs`.)

use settle_core::ShutdownSummary;
use tokio::sync::oneshot;

use super::Recorder;
use crate::report::ShutdownReport;

impl Recorder {
    /// Commits every transcript now (G9).
    pub(super) async fn flush(&mut self) {
        self.report.flushed_in_budget = match self.bounded(self.store.flush()).await {
            Ok(()) => true,
            Err(unwritten) => {
                self.failed(None, "flush transcripts", &unwritten);
                false
            }
        };
    }

    /// Every session is finalized: completes the report, keeps it and
    /// answers the shutdown's waiters.
    pub(super) async fn complete_shutdown(
        &mut self,
        summary: Box<ShutdownSummary>,
        waiters: Vec<oneshot::Sender<ShutdownReport>>,
    ) {
        let until = self
            .deadline
            .borrow()
            .unwrap_or_else(|| tokio::time::Instant::now() + self.store_timeout);
        let mut report = std::mem::take(&mut self.report);
        report.hooks_abandoned = self.hooks.settle(until).await;
        report.works_abandoned = self.works.len();
        report.drained = summary.drained;
        report.cancelled = summary.cancelled;
        report.detached = summary.detached.iter().map(|w| w.session).collect();
        report.store_failures = self.failures.count();
        report.lease_lost = summary.lease_lost;
        report.lease_lost_why = match summary.lease_lost {
            true => self.lease_lost_why.get().cloned(),
            false => None,
        };
        report.handoff = summary.handoff;
        if !report.flushed_in_budget || !report.left_recoverable.is_empty() {
            // Waited for once: closing the store does not wait again.
            self.store.shutdown_gave_up();
        }
        let _ = self.last_report.set(report.clone());
        for waiter in waiters {
            let _ = waiter.send(report.clone());
        }
    }
}
