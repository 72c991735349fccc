//! What cancels one work (a turn or a task) apart from the handle that owns
//! it: for a frontend whose reader and closer are different objects, such as
//! a Python future whose `cancel()` must reach the kernel before the next
//! line of its caller runs.

use settle_core::{Event, WorkId};
use tokio::sync::mpsc;

use crate::command::Command;

/// Cancels one work, as [`Turn::cancel`](crate::Turn::cancel) and
/// [`TaskHandle::cancel`](crate::TaskHandle::cancel) do; cloned freely,
/// kept apart from the handle ([`Turn::canceller`](crate::Turn::canceller),
/// [`TaskHandle::canceller`](crate::TaskHandle::canceller)).
///
/// The cancel is queued to the kernel before [`cancel`](Self::cancel)
/// returns, so whatever the caller asks the kernel next (the session's next
/// turn) is decided after it. A work that has ended is not cancelled again
/// (G6): the core decides that, not the canceller.
#[derive(Debug, Clone)]
pub struct WorkCanceller {
    work: WorkId,
    commands: mpsc::WeakUnboundedSender<Command>,
}

impl WorkCanceller {
    pub(crate) fn new(work: WorkId, commands: mpsc::WeakUnboundedSender<Command>) -> Self {
        WorkCanceller { work, commands }
    }

    /// Which work it cancels.
    pub fn work(&self) -> WorkId {
        self.work
    }

    /// Cancels the work (its token); it gets the settle timeout to unwind.
    /// Nothing when the kernel has stopped.
    pub fn cancel(&self) {
        cancel_work(self.work, &self.commands);
    }
}

/// Asks the core to cancel `work`, if the kernel is still there.
pub(crate) fn cancel_work(work: WorkId, commands: &mpsc::WeakUnboundedSender<Command>) {
    if let Some(commands) = commands.upgrade() {
        let event = Event::CancelWork { work };
        let _ = commands.send(Command::Core { event, reply: None });
    }
}
