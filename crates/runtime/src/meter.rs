//! The runtime's metrics, through the [`metrics`] facade: install any
//! exporter (`metrics-exporter-prometheus`, StatsD, OpenTelemetry) in the
//! program and these appear; with none installed they cost a branch.
//!
//! | name | kind | labels | what |
//! |---|---|---|---|
//! | `settle_sessions_registered_total` | counter | | sessions registered |
//! | `settle_sessions` | gauge | `state` | open sessions by state (`registered`, `running`, `cancelling`, `settled`) |
//! | `settle_sessions_finalized_total` | counter | `end_reason` | sessions finalized, by end reason |
//! | `settle_works_total` | counter | `kind` (`turn`, `task`), `outcome` | works ended, by outcome |
//! | `settle_works_detached_total` | counter | | works detached at their settle deadline (G5) |
//! | `settle_settle_seconds` | histogram | | from a work's cancel to its end (settled or detached) |
//! | `settle_chunk_ack_seconds` | histogram | | from a chunk's append to the store's acknowledgement (G7) |
//! | `settle_store_batch_writes` | histogram | | lifecycle writes per store batch |
//! | `settle_lease_renewals_total` | counter | `result` (`ok`, `failed`) | lease renewals (G8) |
//! | `settle_turn_retries_total` | counter | | retries of a turn's opening before its first chunk |
//!
//! Every name is derived from what the core ordered (its effects) or what
//! a store call took, never from a look at the core's state.

use std::time::Duration;

use settle_core::{EndReason, Outcome, State, WorkKind};

/// Sessions registered.
pub const SESSIONS_REGISTERED: &str = "settle_sessions_registered_total";
/// Open sessions by state.
pub const SESSIONS: &str = "settle_sessions";
/// Sessions finalized, by end reason.
pub const SESSIONS_FINALIZED: &str = "settle_sessions_finalized_total";
/// Works ended, by kind and outcome.
pub const WORKS: &str = "settle_works_total";
/// Works detached at their settle deadline.
pub const WORKS_DETACHED: &str = "settle_works_detached_total";
/// From a work's cancel to its end.
pub const SETTLE_SECONDS: &str = "settle_settle_seconds";
/// From a chunk's append to its acknowledgement.
pub const CHUNK_ACK_SECONDS: &str = "settle_chunk_ack_seconds";
/// Lifecycle writes per store batch.
pub const STORE_BATCH_WRITES: &str = "settle_store_batch_writes";
/// Lease renewals, by result.
pub const LEASE_RENEWALS: &str = "settle_lease_renewals_total";
/// Retries of a turn's opening.
pub const TURN_RETRIES: &str = "settle_turn_retries_total";

/// A session moved from `from` (none: it was registered) to `to`.
pub(crate) fn transition(from: Option<State>, to: State) {
    match from {
        None => metrics::counter!(SESSIONS_REGISTERED).increment(1),
        Some(from) => metrics::gauge!(SESSIONS, "state" => from.as_str()).decrement(1.0),
    }
    if to != State::Finalized {
        metrics::gauge!(SESSIONS, "state" => to.as_str()).increment(1.0);
    }
}

/// A session left this process open, in `state`, with no transition: its
/// registration was withdrawn, or it was handed off to another process.
pub(crate) fn left(state: State) {
    metrics::gauge!(SESSIONS, "state" => state.as_str()).decrement(1.0);
}

/// A session was finalized with `reason`.
pub(crate) fn finalized(reason: EndReason) {
    metrics::counter!(SESSIONS_FINALIZED, "end_reason" => reason.as_str()).increment(1);
}

/// A work ended with `outcome`, `settled` after its cancel if it had one.
pub(crate) fn work_ended(kind: WorkKind, outcome: Outcome, settled: Option<Duration>) {
    let kind = match kind {
        WorkKind::Turn => "turn",
        WorkKind::Task => "task",
    };
    metrics::counter!(WORKS, "kind" => kind, "outcome" => outcome.as_str()).increment(1);
    if let Some(settled) = settled {
        metrics::histogram!(SETTLE_SECONDS).record(settled.as_secs_f64());
    }
}

/// A work was detached.
pub(crate) fn detached() {
    metrics::counter!(WORKS_DETACHED).increment(1);
}

/// A chunk was acknowledged `after` its append.
pub(crate) fn chunk_acked(after: Duration) {
    metrics::histogram!(CHUNK_ACK_SECONDS).record(after.as_secs_f64());
}

/// A batch of `writes` lifecycle writes went to the store.
pub(crate) fn batch(writes: usize) {
    // A batch is at most a few thousand writes: exact as an f64.
    #[allow(clippy::cast_precision_loss)]
    metrics::histogram!(STORE_BATCH_WRITES).record(writes as f64);
}

/// A lease renewal succeeded or failed.
pub(crate) fn lease_renewal(ok: bool) {
    let result = if ok { "ok" } else { "failed" };
    metrics::counter!(LEASE_RENEWALS, "result" => result).increment(1);
}

/// A turn's opening is retried.
pub(crate) fn turn_retry() {
    metrics::counter!(TURN_RETRIES).increment(1);
}
