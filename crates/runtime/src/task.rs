//! Work other than a turn, under the same lifecycle: a tool call, a
//! subprocess, any future a session owns. It is cancelled with its session
//! (or on its own), gets the settle timeout to unwind, and is then detached:
//! aborted, its write access revoked (G1, G5, G6).
//!
//! This file holds the handle side, what the caller holds ([`TaskHandle`]);
//! what the task's own code gets is in `task_context.rs`, and what the driver
//! spawns in `task_work.rs`.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use settle_core::{Outcome, WorkId};
use tokio::sync::{mpsc, oneshot};

use crate::canceller::{cancel_work, WorkCanceller};
use crate::command::{Command, WorkEnd};
use crate::error::TaskError;

/// A spawned task: a [`Future`] of its result, like tokio's `JoinHandle`
/// (`.await` it, or [`join`](Self::join)); [`cancel`](Self::cancel) asks it
/// to stop, as [`Turn::cancel`](crate::Turn::cancel) does a turn. Dropping
/// the handle does not cancel the task: it belongs to its session.
#[derive(Debug)]
pub struct TaskHandle<T> {
    work: WorkId,
    result: oneshot::Receiver<Result<T, String>>,
    outcome: oneshot::Receiver<WorkEnd>,
    commands: mpsc::WeakUnboundedSender<Command>,
    /// The result channel closed without a result: the outcome says why.
    no_result: bool,
}

impl<T> TaskHandle<T> {
    /// Which work this is.
    pub fn work(&self) -> WorkId {
        self.work
    }

    /// Cancels the task (its token); it gets the settle timeout to unwind.
    pub fn cancel(&self) {
        cancel_work(self.work, &self.commands);
    }

    /// What cancels the task apart from this handle: for whoever holds the
    /// task while another awaits it (the awaiter holds the handle).
    pub fn canceller(&self) -> WorkCanceller {
        WorkCanceller::new(self.work, self.commands.clone())
    }

    /// Waits for the task's result (the same as awaiting the handle).
    ///
    /// # Errors
    /// When it was detached, panicked, or the kernel stopped first.
    pub async fn join(self) -> Result<T, TaskError> {
        self.await
    }
}

impl<T> Future for TaskHandle<T> {
    type Output = Result<T, TaskError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if !this.no_result {
            match ready!(Pin::new(&mut this.result).poll(cx)) {
                Ok(Ok(value)) => return Poll::Ready(Ok(value)),
                Ok(Err(panic)) => return Poll::Ready(Err(TaskError::Panicked(panic))),
                // No result: why is the work's end (a receiver is not polled
                // again once it answered).
                Err(_) => this.no_result = true,
            }
        }
        Poll::Ready(match ready!(Pin::new(&mut this.outcome).poll(cx)) {
            Ok((Outcome::Detached, _)) => Err(TaskError::Detached),
            _ => Err(TaskError::Stopped),
        })
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
        no_result: false,
    }
}
