//! [`TaskContext`]: what a spawned task's own code gets from the kernel, its
//! cancellation and its write access.

use settle_core::WorkId;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::error::TaskError;

/// What a spawned task gets: its cancellation token, and a way to know
/// whether it may still write.
#[derive(Debug, Clone)]
pub struct TaskContext {
    pub(crate) work: WorkId,
    pub(crate) token: CancellationToken,
    pub(crate) revoked: CancellationToken,
}

impl TaskContext {
    /// Which work this is.
    pub fn work(&self) -> WorkId {
        self.work
    }

    /// Cancelled when the task should stop: its session (or an ancestor) is
    /// cancelled or finishes, a shutdown's drain ends, or the task itself is
    /// cancelled. Select on it at every await that may take long.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Resolves when the task is cancelled.
    pub fn cancelled(&self) -> WaitForCancellationFuture<'_> {
        self.token.cancelled()
    }

    /// Whether the task was detached (it ignored its cancel past the settle
    /// timeout): from then on nothing it produces is accepted.
    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    /// Resolves when the task's write access is revoked (at its detach).
    pub fn revoked(&self) -> WaitForCancellationFuture<'_> {
        self.revoked.cancelled()
    }

    /// `Ok(())` while the task may still write; [`TaskError::Detached`] once
    /// it was detached. Check it before writing anything on the session's behalf.
    pub fn check_write(&self) -> Result<(), TaskError> {
        if self.is_revoked() {
            Err(TaskError::Detached)
        } else {
            Ok(())
        }
    }
}
