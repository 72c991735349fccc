//! Log lines in runs: for what can happen a thousand times at once (a
//! store restart met by every streaming turn; a flood of refused
//! connections), the first line of each kind is written, the lines of the
//! same kind within [`QUIET`] of the last one written are counted instead,
//! and the count is said with the next line of the kind written and, for a
//! run still unsaid, when its owner stops.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// How long after a kind's line another of its kind is counted rather than
/// written.
pub const QUIET: Duration = Duration::from_secs(10);

/// One kind's run: when its last line was written, and how many of it
/// came since without one.
#[derive(Debug, Default, Clone, Copy)]
struct Run {
    written: Option<Instant>,
    unwritten: u64,
}

/// The runs of `N` kinds of log line, each kind an index below `N`.
///
/// ```
/// use settle_runtime::LogRuns;
///
/// let runs = LogRuns::<2>::default();
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// assert_eq!(runs.write(0), Some(0)); // written
/// assert_eq!(runs.write(0), None); // counted
/// assert_eq!(runs.write(1), Some(0)); // another kind: written
/// assert_eq!(runs.take_unwritten(), [(0, 1)]);
/// # });
/// ```
#[derive(Debug)]
pub struct LogRuns<const N: usize> {
    runs: Mutex<[Run; N]>,
}

impl<const N: usize> Default for LogRuns<N> {
    fn default() -> Self {
        LogRuns {
            runs: Mutex::new([Run::default(); N]),
        }
    }
}

impl<const N: usize> LogRuns<N> {
    /// A line of kind `kind` (below `N`; a kind out of range is always
    /// written) is due: `Some(n)` when it is to be written now, `n` being
    /// how many of its kind went unwritten before it; `None` when it is
    /// counted instead. Times are tokio's (a paused clock counts).
    pub fn write(&self, kind: usize) -> Option<u64> {
        let now = Instant::now();
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(run) = runs.get_mut(kind) else {
            return Some(0);
        };
        match run.written {
            Some(at) if now.saturating_duration_since(at) < QUIET => {
                run.unwritten += 1;
                None
            }
            _ => {
                run.written = Some(now);
                Some(std::mem::take(&mut run.unwritten))
            }
        }
    }

    /// The lines counted and not said yet, by kind, each taken (so said
    /// once): for the owner's last lines.
    pub fn take_unwritten(&self) -> Vec<(usize, u64)> {
        let mut runs = self.runs.lock().unwrap_or_else(PoisonError::into_inner);
        runs.iter_mut()
            .enumerate()
            .filter_map(|(kind, run)| {
                let n = std::mem::take(&mut run.unwritten);
                (n > 0).then_some((kind, n))
            })
            .collect()
    }

    /// As the owner stops: one warning for each kind with lines counted
    /// since its last one, `what(kind)` saying what they were ("upgrades
    /// refused for their origin").
    pub fn say_unwritten(&self, what: impl Fn(usize) -> &'static str) {
        for (kind, count) in self.take_unwritten() {
            tracing::warn!(
                count,
                "{count} more {} since the last such line, not logged one by one",
                what(kind)
            );
        }
    }
}

/// Logs a line (`tracing::$level!` with the fields and message given) if
/// `due`, what [`LogRuns::write`] answered for its kind, lets it be written
/// now, with how many of its kind went unwritten before it
/// (`unlogged_before`).
///
/// ```
/// # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
/// let runs = settle_runtime::LogRuns::<1>::default();
/// for attempt in 0..3 {
///     settle_runtime::log_in_runs!(runs.write(0), warn, attempt, "refused");
/// }
/// # });
/// ```
#[macro_export]
macro_rules! log_in_runs {
    ($due:expr, $level:ident, $($line:tt)+) => {
        match $due {
            Some(0) => $crate::__tracing::$level!($($line)+),
            Some(unlogged_before) => $crate::__tracing::$level!(unlogged_before, $($line)+),
            None => {}
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of one kind writes one line each [`QUIET`], carrying how
    /// many went unwritten; another kind has runs of its own; the count of
    /// a run still unsaid is taken once, at the end.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_one_kind_writes_one_line_a_quiet_period_with_its_count() {
        let runs = LogRuns::<2>::default();
        assert_eq!(runs.write(0), Some(0));
        for _ in 0..500 {
            assert_eq!(runs.write(0), None);
        }
        assert_eq!(runs.write(1), Some(0), "another kind is written at once");
        tokio::time::advance(QUIET - Duration::from_millis(1)).await;
        assert_eq!(runs.write(0), None);
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(runs.write(0), Some(501));
        assert_eq!(runs.write(0), None);
        assert_eq!(runs.write(1), Some(0));
        assert_eq!(runs.write(7), Some(0), "a kind out of range is written");
        assert_eq!(runs.take_unwritten(), [(0, 1)]);
        assert!(runs.take_unwritten().is_empty(), "said once");
    }
}
