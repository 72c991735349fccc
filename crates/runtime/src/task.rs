//! Work other than a turn, under the same lifecycle: a tool call, a
//! subprocess, any future a session owns. It is cancelled with its session
//! (or on its own), gets the settle timeout to unwind, and is then detached:
//! aborted, its write access revoked (G1, G5, G6).

use std::future::Future;
use std::pin::Pin;

use futures_util::FutureExt;
use settle_core::{Event, Outcome, TurnError, TurnErrorKind, WorkId};
use settle_stream::{CancelledBy, WorkEnd as StreamEnd, WorkSignal};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};

use crate::command::Command;

/// What a spawned task gets: its cancellation token, and a way to know
/// whether it may still write.
#[derive(Debug, Clone)]
pub struct TaskContext {
    work: WorkId,
    token: CancellationToken,
    revoked: CancellationToken,
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

/// Why a task gave no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TaskError {
    /// It ignored its cancel past the settle timeout and was abandoned; its
    /// result, if it ever produced one, was refused.
    #[error("the task ignored its cancellation past the settle timeout and was detached")]
    Detached,
    /// It panicked, with this message (the panic's payload).
    #[error("the task panicked: {0}")]
    Panicked(String),
    /// The kernel stopped before the task said how it ended.
    #[error("the kernel stopped before the task ended")]
    Stopped,
}

/// A spawned task: its result, once it ends.
#[derive(Debug)]
pub struct TaskHandle<T> {
    work: WorkId,
    result: oneshot::Receiver<Result<T, String>>,
    outcome: oneshot::Receiver<crate::command::WorkEnd>,
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

/// A task as the driver keeps it until the core admits it: the user's
/// closure, boxed, with what reports its end.
pub(crate) type StartTask = Box<
    dyn FnOnce(
            TaskContext,
            mpsc::UnboundedSender<(WorkId, WorkSignal)>,
        ) -> Pin<Box<dyn Future<Output = ()> + Send>>
        + Send,
>;

/// Boxes `make` into what the driver starts once the core admits the task,
/// and the receiving half of its result.
pub(crate) fn prepare<F, Fut, T>(make: F) -> (StartTask, oneshot::Receiver<Result<T, String>>)
where
    F: FnOnce(TaskContext) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let (result_tx, result) = oneshot::channel();
    let start: StartTask = Box::new(move |ctx: TaskContext, reports| {
        Box::pin(async move {
            let work = ctx.work;
            let (token, revoked) = (ctx.token.clone(), ctx.revoked.clone());
            let ended = std::panic::AssertUnwindSafe(make(ctx)).catch_unwind().await;
            let end = match ended {
                Ok(value) => {
                    // Its write access is revoked once detached: a late
                    // result is refused.
                    if !revoked.is_cancelled() {
                        let _ = result_tx.send(Ok(value));
                    }
                    if token.is_cancelled() {
                        StreamEnd::Cancelled(CancelledBy::Request)
                    } else {
                        StreamEnd::Completed
                    }
                }
                Err(panic) => {
                    let message = crate::work::panic_message(panic.as_ref());
                    // The handle says "the task panicked" once, before the message.
                    if !revoked.is_cancelled() {
                        let _ = result_tx.send(Err(message.clone()));
                    }
                    let error = TurnError::new(
                        TurnErrorKind::Panic,
                        format!("the task panicked: {message}"),
                    );
                    StreamEnd::Panicked(error)
                }
            };
            let _ = reports.send((work, WorkSignal::Ended(end)));
        })
    });
    (start, result)
}

/// The context of a new task and the handle's half of its end.
pub(crate) fn context(work: WorkId) -> (TaskContext, CancellationToken, CancellationToken) {
    let (token, revoked) = (CancellationToken::new(), CancellationToken::new());
    let ctx = TaskContext {
        work,
        token: token.clone(),
        revoked: revoked.clone(),
    };
    (ctx, token, revoked)
}

pub(crate) fn handle<T>(
    work: WorkId,
    result: oneshot::Receiver<Result<T, String>>,
    outcome: oneshot::Receiver<crate::command::WorkEnd>,
    commands: mpsc::WeakUnboundedSender<Command>,
) -> TaskHandle<T> {
    TaskHandle {
        work,
        result,
        outcome,
        commands,
    }
}
