use settle_core::{EndReason, SessionId};

/// What a shutdown did (G9).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Turns that were running when shutdown began and finished within the drain.
    pub drained: Vec<SessionId>,
    /// Turns still running when the drain ended, cancelled immediately.
    pub cancelled: Vec<SessionId>,
    /// Works that ignored cancellation and were detached (write access revoked).
    pub detached: Vec<SessionId>,
    /// Every session finalized during the shutdown, with its end reason, in order.
    pub finalized: Vec<(SessionId, EndReason)>,
    /// Sessions left unfinalized (recoverable by `recover`, G8); empty unless
    /// the store failed.
    pub left_recoverable: Vec<SessionId>,
    /// Store writes that failed during the shutdown.
    pub store_failures: usize,
    /// Whether every transcript was flushed within the flush budget.
    pub flushed_in_budget: bool,
}
