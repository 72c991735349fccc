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
//!
//! The metrics the driver moves on every effect go through `Meter`'s
//! handles, registered once each with the recorder installed at the time
//! (as every `metrics` handle is bound): install the exporter before the
//! kernel starts.

use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
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

/// The driver's handles to the metrics it moves on every effect, each
/// registered at its first use: a `metrics` macro builds and hashes its key
/// and asks the recorder on every call, which a teardown would pay for
/// every transition of thousands of sessions.
#[derive(Default)]
pub(crate) struct Meter {
    registered: Option<Counter>,
    states: [Option<Gauge>; State::ALL.len()],
    finalized: [Option<Counter>; EndReason::ALL.len()],
    /// By kind (turn, task) and outcome.
    works: [[Option<Counter>; Outcome::ALL.len()]; 2],
    settle: Option<Histogram>,
    detached: Option<Counter>,
}

impl Meter {
    /// A session moved from `from` (none: it was registered) to `to`.
    pub(crate) fn transition(&mut self, from: Option<State>, to: State) {
        match from {
            None => self
                .registered
                .get_or_insert_with(|| metrics::counter!(SESSIONS_REGISTERED))
                .increment(1),
            Some(from) => self.state(from).decrement(1.0),
        }
        if to != State::Finalized {
            self.state(to).increment(1.0);
        }
    }

    /// A session left this process open, in `state`, with no transition:
    /// its registration was withdrawn, or it was handed off to another
    /// process.
    pub(crate) fn left(&mut self, state: State) {
        self.state(state).decrement(1.0);
    }

    fn state(&mut self, state: State) -> &Gauge {
        self.states[state as usize]
            .get_or_insert_with(|| metrics::gauge!(SESSIONS, "state" => state.as_str()))
    }

    /// A session was finalized with `reason`.
    pub(crate) fn finalized(&mut self, reason: EndReason) {
        self.finalized[reason as usize]
            .get_or_insert_with(
                || metrics::counter!(SESSIONS_FINALIZED, "end_reason" => reason.as_str()),
            )
            .increment(1);
    }

    /// A work ended with `outcome`, `settled` after its cancel if it had one.
    pub(crate) fn work_ended(
        &mut self,
        kind: WorkKind,
        outcome: Outcome,
        settled: Option<Duration>,
    ) {
        let (index, label) = match kind {
            WorkKind::Turn => (0, "turn"),
            WorkKind::Task => (1, "task"),
        };
        self.works[index][outcome as usize]
            .get_or_insert_with(
                || metrics::counter!(WORKS, "kind" => label, "outcome" => outcome.as_str()),
            )
            .increment(1);
        if let Some(settled) = settled {
            self.settle
                .get_or_insert_with(|| metrics::histogram!(SETTLE_SECONDS))
                .record(settled.as_secs_f64());
        }
    }

    /// A work was detached.
    pub(crate) fn detached(&mut self) {
        self.detached
            .get_or_insert_with(|| metrics::counter!(WORKS_DETACHED))
            .increment(1);
    }
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
