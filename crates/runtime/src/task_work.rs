//! A task's work side: what the driver spawns once the core admits it (the
//! user's closure, boxed with what reports its end), and the context it is
//! started with. The handle side, what the caller holds, is in `task.rs`.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;

use futures_util::FutureExt;
use settle_core::{TurnError, TurnErrorKind, WorkId};
use settle_stream::{CancelledBy, WorkEnd as StreamEnd, WorkSignal};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::task_context::TaskContext;
use crate::task_outcome::TaskFailure;

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
/// and the receiving half of its result; the task is recorded `completed`
/// when it returns (`cancelled` if it was cancelled meanwhile).
pub(crate) fn prepare<F, Fut, T>(make: F) -> (StartTask, oneshot::Receiver<Result<T, String>>)
where
    F: FnOnce(TaskContext) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    prepare_labelled(make, |_: &T| Ok(()))
}

/// As [`prepare`], the end of a task that returned (and was not cancelled
/// meanwhile) labelled by what `label` says of its output.
pub(crate) fn prepare_labelled<F, Fut, T, L>(
    make: F,
    label: L,
) -> (StartTask, oneshot::Receiver<Result<T, String>>)
where
    F: FnOnce(TaskContext) -> Fut + Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
    L: FnOnce(&T) -> Result<(), TaskFailure> + Send + 'static,
{
    let (result_tx, result) = oneshot::channel();
    let start: StartTask = Box::new(move |ctx: TaskContext, reports| {
        Box::pin(async move {
            let work = ctx.work;
            let (token, revoked) = (ctx.token.clone(), ctx.revoked.clone());
            // The closure's own code before its future (building a
            // command, a client) may panic too: it ends the task the same way.
            let ended = match std::panic::catch_unwind(AssertUnwindSafe(|| make(ctx))) {
                Ok(future) => AssertUnwindSafe(future).catch_unwind().await,
                Err(panic) => Err(panic),
            };
            // Labelled as it ended: a cancel that lands after it returned
            // does not make it cancelled.
            let (end, result) = match ended {
                Ok(value) => {
                    let end = match (token.is_cancelled(), label(&value)) {
                        (true, _) => StreamEnd::Cancelled(CancelledBy::Request),
                        (false, Ok(())) => StreamEnd::Completed,
                        (false, Err(TaskFailure::Failed(message))) => {
                            StreamEnd::Failed(TurnError::new(TurnErrorKind::Task, message))
                        }
                        // It stopped on its own: not cancelled again (G6).
                        (false, Err(TaskFailure::Cancelled)) => {
                            StreamEnd::Cancelled(CancelledBy::Provider)
                        }
                    };
                    (end, Ok(value))
                }
                Err(panic) => {
                    let message = panic_message(panic.as_ref());
                    let error = TurnError::new(
                        TurnErrorKind::Panic,
                        format!("the task panicked: {message}"),
                    );
                    // The handle says "the task panicked" once, before the message.
                    (StreamEnd::Panicked(error), Err(message))
                }
            };
            // The driver hears of the end before the caller has the
            // result: whatever the caller asks for next (a finish) comes
            // after it, and finds the work ended (G6), as the driver reads
            // the works' reports before its commands.
            let _ = reports.send((work, WorkSignal::Ended(end)));
            // Its write access is revoked once detached: a late result is
            // refused.
            if !revoked.is_cancelled() {
                let _ = result_tx.send(result);
            }
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

/// The message a panic carried.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned())
}
