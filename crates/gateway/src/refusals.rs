//! The log lines of clients the gateway does not serve (a connection over
//! its maximum, an upgrade from an origin it does not allow or without a
//! valid token, a TLS handshake or a request header that never came).
//! Anyone who can reach the port makes them, one per attempt, so a flood
//! of attempts would grow the log without bound (about 100 bytes each: a
//! third of a gigabyte an hour at a thousand a second). Each kind is
//! logged in runs: the first refusal of a kind is written; those that
//! follow within [`QUIET`](settle_runtime::log_runs::QUIET) of the last one written are counted, and the
//! count is said with the next one written (at most one line per kind
//! every `QUIET`) and, for a run still unsaid, when the gateway stops.

use settle_runtime::LogRuns;

#[cfg(test)]
use settle_runtime::log_runs::QUIET;

/// A kind of refusal, each with its own runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// A connection over the gateway's maximum.
    AtCapacity,
    /// An upgrade from a web origin not allowed.
    Origin,
    /// An upgrade without a valid token.
    Unauthenticated,
    /// An upgrade of a principal with its maximum of connections open.
    PrincipalAtCapacity,
    /// A TLS handshake that failed or never came.
    Handshake,
    /// A connection with no whole request header within the header timeout.
    HeaderTimeout,
}

impl Refusal {
    const ALL: [Refusal; 6] = [
        Refusal::AtCapacity,
        Refusal::Origin,
        Refusal::Unauthenticated,
        Refusal::PrincipalAtCapacity,
        Refusal::Handshake,
        Refusal::HeaderTimeout,
    ];

    /// What the refused were, as the run's last line says.
    fn what(self) -> &'static str {
        match self {
            Refusal::AtCapacity => "connections refused at the gateway's maximum",
            Refusal::Origin => "upgrades refused for their origin",
            Refusal::Unauthenticated => "upgrades refused as not authenticated",
            Refusal::PrincipalAtCapacity => "upgrades refused at their principal's maximum",
            Refusal::Handshake => "connections dropped for their TLS handshake",
            Refusal::HeaderTimeout => "connections dropped at the header timeout",
        }
    }
}

/// The runs of every kind of refusal (see the [module documentation](self)).
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    runs: LogRuns<{ Refusal::ALL.len() }>,
}

impl Refusals {
    /// A refusal of `kind` happened: `Some(n)` when its line is to be
    /// written now, `n` being how many of its kind went unwritten before
    /// it; `None` when it is counted instead.
    pub(crate) fn write(&self, kind: Refusal) -> Option<u64> {
        self.runs.write(kind as usize)
    }

    /// The refusals counted and not said yet, by kind, each taken.
    #[cfg(test)]
    fn take_unwritten(&self) -> Vec<(Refusal, u64)> {
        self.runs
            .take_unwritten()
            .into_iter()
            .filter_map(|(kind, n)| Some((*Refusal::ALL.get(kind)?, n)))
            .collect()
    }

    /// As the gateway stops: one line for each kind with refusals counted
    /// since its last line.
    pub(crate) fn say_unwritten(&self) {
        self.runs
            .say_unwritten(|kind| Refusal::ALL.get(kind).map_or("", |k| k.what()));
    }
}

/// Logs a refusal's line (`tracing::warn!` with the fields and message
/// given) if its run lets it be written now, with how many of its kind
/// went unwritten before it (see [`Refusals::write`]).
macro_rules! refused {
    ($refusals:expr, $kind:expr, $($line:tt)+) => {
        settle_runtime::log_in_runs!($refusals.write($kind), warn, $($line)+)
    };
}
pub(crate) use refused;

#[cfg(test)]
mod tests {
    use super::*;

    /// Each kind of refusal has runs of its own, and the counts said at
    /// the end name their kinds.
    #[tokio::test(start_paused = true)]
    async fn a_flood_of_refusals_writes_one_line_a_quiet_period_with_its_count() {
        let refusals = Refusals::default();
        assert_eq!(refusals.write(Refusal::Origin), Some(0));
        for _ in 0..500 {
            assert_eq!(refusals.write(Refusal::Origin), None);
        }
        assert_eq!(refusals.write(Refusal::AtCapacity), Some(0));
        tokio::time::advance(QUIET).await;
        assert_eq!(refusals.write(Refusal::Origin), Some(500));
        assert_eq!(refusals.write(Refusal::HeaderTimeout), Some(0));
        assert_eq!(refusals.write(Refusal::HeaderTimeout), None);
        assert_eq!(refusals.take_unwritten(), [(Refusal::HeaderTimeout, 1)]);
        assert!(refusals.take_unwritten().is_empty(), "said once");
    }
}
