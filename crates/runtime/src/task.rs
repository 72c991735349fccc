//! Work other than a turn, under the same lifecycle: a tool call, a
//! subprocess, any future a session owns. It is cancelled with its session
//! (or on its own), gets the settle timeout to unwind, and is then detached:
//! aborted, its write access revoked (G1, G5, G6).
//!
//! This file holds the handle side, what the caller holds ([`TaskHandle`]);
//! what the task's own code gets is in `task_context.rs`, and what the driver
//! spawns in `task_work.rs`.

use settle_core::{Event, Outcome, WorkId};
use tokio::sync::{mpsc, oneshot};

use crate::command::{Command, WorkEnd};
use crate::error::TaskError;

/// A spawned task: its result, once it ends.
#[derive(Debug)]
pub struct TaskHandle<T> {
    work: WorkId,
    result: oneshot::Receiver<Result<T, String>>,
    outcome: oneshot::Receiver<WorkEnd>,
    commands: mpsc::WeakUnboundedSender<Command>,
}

impl<T> TaskHandle<T> {
    /// Which work this is.
    pub fn work(&self) -> WorkId {
        self.work
    }

    /// Cancels the task (its token); it gets the settle timeout to unwind.
    pub fn cancel(&self) {
        if let Some(commands) = self.commands.upgrade() {
            let event = Event::CancelWork { work: self.work };
            let _ = commands.send(Command::Core { event, reply: None });
        }
    }

    /// Waits for the task's result.
    ///
    /// # Errors
    /// When it was detached, panicked, or the kernel stopped first.
    pub async fn join(self) -> Result<T, TaskError> {
        match self.result.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(panic)) => Err(TaskError::Panicked(panic)),
            Err(_) => match self.outcome.await {
                Ok((Outcome::Detached, _)) => Err(TaskError::Detached),
                _ => Err(TaskError::Stopped),
            },
        }
    }
}

pub(crate) fn handle<T>(
    work: WorkId,
    result: oneshot::Receiver<Result<T, String>>,
    outcome: oneshot::Receiver<WorkEnd>,
    commands: mpsc::WeakUnboundedSender<Command>,
) -> TaskHandle<T> {
    TaskHandle {
        work,
        result,
        outcome,
        commands,
    }
}
