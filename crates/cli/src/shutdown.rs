//! Signals for `run` and `chat`: the handlers are installed before anything
//! starts and kept until the process exits, so no signal is ever swallowed.
//! The first SIGINT/SIGTERM/SIGHUP starts the kernel's graceful shutdown
//! (G9); every later one skips the rest of the drain. The shutdown is bounded
//! (drain + settle timeout + flush budget) whatever the works and the store
//! do, so no signal needs to cut it shorter and leave sessions unfinalized.

use std::future::Future;
use std::time::Duration;

use settle_runtime::signals::{ShutdownSignal, Signals};
use settle_runtime::Kernel;

use crate::Failure;

/// Drives `kernel`'s shutdown from the handlers [`install`] installed;
/// resolves with the first signal once the shutdown has begun. A signal
/// after the kernel stopped is ignored until `until` is done (the summary
/// is written whole), and then ends the process as it would without
/// handlers. The first
/// signal is also recorded ([`settle_runtime::signals::received`]) before the
/// shutdown begins, so a caller that sees the kernel stop first still learns
/// that a signal stopped it.
pub fn watch(
    signals: Signals,
    kernel: &Kernel,
    drain: Duration,
    until: impl Future<Output = ()> + Send + 'static,
) -> impl Future<Output = ShutdownSignal> + Send + 'static {
    signals.drive_until(kernel, drain, until)
}

/// Installs the handlers, before anything is opened: a signal that comes
/// while the store opens is kept for [`watch`], instead of killing the
/// process with a file half made.
///
/// # Errors
/// When the handlers cannot be installed.
pub fn install() -> Result<Signals, Failure> {
    Signals::install()
        .map_err(|e| Failure::store(format!("cannot install the signal handlers: {e}")))
}

/// The one line a shutdown that could not commit everything prints: how
/// many sessions were left, why, and what finishes them (G8, G9). In a
/// fleet (`fleet`: `serve` on PostgreSQL with handoff), the other processes
/// adopt what it left once its lease has run out, so `settle recover` is
/// what finishes them only when no other process serves the database: run
/// earlier, it would finalize sessions a peer is about to adopt.
pub fn say_left(report: &settle_runtime::ShutdownReport, fleet: bool) {
    crate::errln!("{}", left_line(report, fleet));
}

/// [`say_left`]'s line.
fn left_line(report: &settle_runtime::ShutdownReport, fleet: bool) -> String {
    let left = report.left_recoverable.len();
    let sessions = if left == 1 { "session" } else { "sessions" };
    let finish = match fleet {
        true => "the other processes of the fleet adopt them once this process's lease has run out; run `settle recover` only if none is left",
        false => "run `settle recover` once the store is healthy",
    };
    // Counted when the process gave up waiting: a write the store had
    // queued may still land before the process is gone, and a peer may
    // take what a lost lease left, so the count is an upper bound.
    if report.lease_lost {
        // Why, as the renewer found it: a lease the store says expired,
        // or the store's last failure (a full disk, a server gone).
        let why = report
            .lease_lost_why
            .as_deref()
            .map(|why| format!(" ({})", crate::escape::one_line(why)))
            .unwrap_or_default();
        if left == 0 {
            // Nothing to recover: no advice to run anything (a process
            // paused past its lease with no session said "up to 0
            // sessions", and to run `settle recover`).
            return format!(
                "settle: this process lost its lease on its sessions{why}, so it stopped; it left no session for recovery"
            );
        }
        format!(
            "settle: this process lost its lease on its sessions{why}, so it stopped; up to {left} {sessions} left for recovery (another process may have taken them already): {finish}"
        )
    } else {
        format!(
            "settle: up to {left} {sessions} left unfinalized (the store did not commit them in time; some may have landed since); {finish}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::left_line;
    use settle_runtime::{SessionId, ShutdownReport};

    #[test]
    fn a_lease_lost_with_nothing_left_advises_nothing_to_run() {
        let mut report = ShutdownReport::default();
        report.lease_lost = true;
        report.lease_lost_why = Some("the lease could not be renewed before it expired".into());
        let line = left_line(&report, false);
        assert!(
            line.ends_with("so it stopped; it left no session for recovery"),
            "{line}"
        );
        assert!(!line.contains("settle recover"), "{line}");
        report.left_recoverable = vec![SessionId(7)];
        let line = left_line(&report, false);
        assert!(
            line.contains("up to 1 session left for recovery") && line.contains("settle recover"),
            "{line}"
        );
    }
}
