use settle_core::{EndReason, SessionId};

/// What a shutdown did (G9): what the core decided, and what the store made of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[non_exhaustive]
pub struct ShutdownReport {
    /// Turns that were running when shutdown began and finished within the drain.
    pub drained: Vec<SessionId>,
    /// Turns still running when the drain ended, cancelled immediately.
    pub cancelled: Vec<SessionId>,
    /// Works that ignored cancellation and were detached (write access revoked).
    pub detached: Vec<SessionId>,
    /// Every session whose finalize the store committed during the
    /// shutdown, with its end reason, in order (one it did not commit is in
    /// `left_recoverable` instead).
    pub finalized: Vec<(SessionId, EndReason)>,
    /// Sessions whose finalize was not committed (the store failed, or did not
    /// answer within the shutdown's budget), during the shutdown or before
    /// it: left for `recover` (G8). Empty unless the store failed.
    ///
    /// A write the store was still working on at the budget's end (a
    /// transaction waiting for SQLite's lock, a server that has not
    /// answered) may be committed after the shutdown returned: a session
    /// named here may then be found finalized, its children with it, as the
    /// kernel decided (a finalize is written only with or after its
    /// children's, G1). Recovering such a session changes nothing (G2).
    pub left_recoverable: Vec<SessionId>,
    /// Store writes that failed over the kernel's whole life, the
    /// shutdown's included (what [`Kernel::store_failures`](crate::Kernel::store_failures)
    /// says at its end): each write the store refused for good, or that
    /// was given up at the shutdown's deadline. A write a store blip held
    /// back and a later try wrote is not counted; it did not fail.
    pub store_failures: usize,
    /// Whether the store's writes in flight were drained within the flush
    /// budget: every chunk handed to it was committed or answered with its
    /// failure (a full disk fails them; [`store_failures`](Self::store_failures)
    /// counts those, and the turns they belonged to ended `failed`). It
    /// does not say that every chunk was committed.
    pub flushed_in_budget: bool,
    /// `on_session_end` hooks still running when the shutdown returned;
    /// they were abandoned (the process may end before they return). Every
    /// hook fired was called by then: once the shutdown's budget ran out,
    /// those waiting for the concurrency limit were started without it.
    pub hooks_abandoned: usize,
    /// Works still running when every session was finalized: detached ones
    /// stuck where they cannot be aborted (a blocking call). Their write
    /// access is revoked; nothing they do reaches the store.
    pub works_abandoned: usize,
    /// The shutdown was forced by the loss of this process's lease (G8):
    /// what was not finalized is left for another process to recover.
    pub lease_lost: bool,
    /// Why the lease was lost, as the renewer found it (the store said it
    /// expired, or no renewal landed for a whole TTL and what the store
    /// said last: a full disk, a server gone), when it was.
    pub lease_lost_why: Option<String>,
    /// The shutdown handed sessions off (SPEC §12) instead of finalizing them.
    pub handoff: bool,
    /// Sessions released in the store for another process to adopt, in order.
    pub released: Vec<SessionId>,
    /// The kernel had stopped before this shutdown was asked for, with no
    /// shutdown completed (the tokio runtime it was started on was dropped,
    /// before or during one): nothing more was drained, finalized or
    /// flushed, and the sessions it left live
    /// are in the store as a crashed process leaves them, for `settle
    /// recover` once this process has exited or its lease has run out (G8).
    #[cfg_attr(feature = "serde", serde(default))]
    pub stopped_without_shutdown: bool,
}

#[cfg(all(test, feature = "serde"))]
mod tests {
    use super::*;

    #[test]
    fn a_report_round_trips_through_json_with_the_stable_spellings() {
        let report = ShutdownReport {
            drained: vec![SessionId(2)],
            finalized: vec![(SessionId(2), EndReason::Shutdown)],
            flushed_in_budget: true,
            ..ShutdownReport::default()
        };
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["finalized"], serde_json::json!([[2, "shutdown"]]));
        let back: ShutdownReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }
}
