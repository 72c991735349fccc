//! The kernel's store failures: counted (the shutdown's report and
//! [`Kernel::store_failures`](crate::Kernel::store_failures) say how many)
//! and logged in runs ([`LogRuns`]). A store that blips is met by every
//! turn streaming and every write queued at that moment: a PostgreSQL
//! restart under 200 streaming turns wrote 200 lines at the default log
//! level, one a turn. Each kind below writes its first line with the
//! session and the database's own words; those of its kind within
//! [`QUIET`](crate::log_runs::QUIET) are counted, and the count is said
//! with the kind's next line (`unlogged_before`) and, for a run still
//! unsaid, when the kernel stops. The events
//! ([`StoreRetrying`](crate::LifecycleEvent::StoreRetrying),
//! [`StoreFailed`](crate::LifecycleEvent::StoreFailed)) stay one a session.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::log_runs::LogRuns;

/// A kind of store failure line, each with its own runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StoreFailure {
    /// A chunk the store did not take, tried again.
    ChunkRetried,
    /// A lifecycle write the store did not take, tried again.
    WriteRetried,
    /// A turn stopped because its chunk or its start could not be stored.
    TurnStopped,
    /// A lifecycle write given up on.
    WriteFailed,
    /// A session whose registration was refused to its caller, written
    /// after all (its commit's answer was lost, or came past the store
    /// timeout), and finalized.
    Withdrawn,
}

impl StoreFailure {
    const ALL: [StoreFailure; 5] = [
        StoreFailure::ChunkRetried,
        StoreFailure::WriteRetried,
        StoreFailure::TurnStopped,
        StoreFailure::WriteFailed,
        StoreFailure::Withdrawn,
    ];

    /// What the failures were, as a run's last line says.
    fn what(self) -> &'static str {
        match self {
            StoreFailure::ChunkRetried => "chunks failed to persist and were tried again",
            StoreFailure::WriteRetried => "lifecycle writes failed and were tried again",
            StoreFailure::TurnStopped => "turns stopped for a store failure",
            StoreFailure::WriteFailed => "lifecycle writes failed",
            StoreFailure::Withdrawn => {
                "sessions whose registration was refused were written after all and finalized"
            }
        }
    }
}

/// The store failures of one kernel (see the [module documentation](self)).
#[derive(Debug, Default)]
pub(crate) struct StoreFailures {
    count: AtomicUsize,
    runs: LogRuns<{ StoreFailure::ALL.len() }>,
}

impl StoreFailures {
    /// Counts one failure (a write given up on, a turn stopped).
    pub(crate) fn add(&self) {
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// How many were counted.
    pub(crate) fn count(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// A line of `kind` is due: `Some(n)` to write it now, after `n` of its
    /// kind went unwritten; `None` when it is counted instead.
    pub(crate) fn line(&self, kind: StoreFailure) -> Option<u64> {
        self.runs.write(kind as usize)
    }

    /// As the kernel stops: one line for each kind with lines counted
    /// since its last one.
    pub(crate) fn say_unwritten(&self) {
        self.runs
            .say_unwritten(|kind| StoreFailure::ALL.get(kind).map_or("", |k| k.what()));
    }
}

/// Logs a store failure's line (`tracing::$level!` with the fields and
/// message given) if its run lets it be written now, with how many of its
/// kind went unwritten before it (see [`StoreFailures::line`]).
macro_rules! store_failure {
    ($failures:expr, $kind:expr, $level:ident, $($line:tt)+) => {
        $crate::log_in_runs!($failures.line($kind), $level, $($line)+)
    };
}
pub(crate) use store_failure;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_kind_of_store_failure_has_its_own_runs_and_the_count_is_separate() {
        let failures = StoreFailures::default();
        assert_eq!(failures.line(StoreFailure::ChunkRetried), Some(0));
        assert_eq!(failures.line(StoreFailure::ChunkRetried), None);
        assert_eq!(failures.line(StoreFailure::WriteFailed), Some(0));
        assert_eq!(failures.count(), 0, "a line is not a failure counted");
        failures.add();
        assert_eq!(failures.count(), 1);
    }
}
