//! Work a closed event loop can strand: a turn's pump or a spawned
//! coroutine whose asyncio task was still pending when its loop closed
//! without cancelling it (`loop.close()` after `run_until_complete`, a
//! test's loop torn down under a session-wide kernel). That task never runs
//! again and hears nothing more, so the kernel would wait for it until an
//! idle timeout (or for good, with none). Each such work registers with its
//! loop's mailbox; the deliverer asks the mailboxes that have any whether
//! their loop closed, about once a second, and ends what a closed one left.

use pyo3::Python;

/// How often the deliverer looks for loops closed under pending work.
pub(crate) const PROBE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// A work whose Python side runs on one event loop.
pub(crate) trait Stranded: Send + Sync {
    /// Ends the work as cancelled if its loop closed with it still pending
    /// (nothing if it has ended, or its loop is open).
    fn end_if_loop_closed(&self, py: Python<'_>);
}
