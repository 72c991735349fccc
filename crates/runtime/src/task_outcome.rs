//! What a task's output says of how it ended, for its record (SPEC §7's
//! `outcome` of a work): a tool that returned an error ended `failed`, one
//! that gave up on its own ended `cancelled`, whoever awaits it being given
//! the output all the same.

use std::fmt::Display;

/// How a task ended by its own account, when it did not complete its work.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum TaskFailure {
    /// It failed: announced with this message and the error kind `task`
    /// (`LifecycleEvent::WorkEnded`, the log: keep secrets out of it), and
    /// recorded `failed` in the store when it is the last work of its
    /// session to end (the session's last outcome, its timeline's "task
    /// ended: failed"). The store keeps no row per task: one that ends
    /// while other work of its session runs is told only by its event and
    /// to its awaiter.
    Failed(String),
    /// It stopped on its own, not cancelled by the kernel: recorded
    /// `cancelled`, and not cancelled again (G6).
    Cancelled,
}

/// The output of a task spawned with
/// [`SessionHandle::spawn_with_outcome`](crate::SessionHandle::spawn_with_outcome):
/// it says whether the task did its work. A task the kernel cancelled is
/// recorded `cancelled` whatever its output says.
///
/// ```
/// use settle_runtime::{TaskFailure, TaskOutcome};
///
/// // A `Result` ends `failed` with its error's words when it is an `Err`.
/// let failed: Result<u32, String> = Err("no host answered".into());
/// assert_eq!(failed.task_outcome(), Err(TaskFailure::Failed("no host answered".into())));
/// ```
pub trait TaskOutcome {
    /// `Ok(())` when the task completed its work, else how it did not.
    fn task_outcome(&self) -> Result<(), TaskFailure>;
}

impl<T, E: Display> TaskOutcome for Result<T, E> {
    fn task_outcome(&self) -> Result<(), TaskFailure> {
        match self {
            Ok(_) => Ok(()),
            Err(error) => Err(TaskFailure::Failed(error.to_string())),
        }
    }
}
