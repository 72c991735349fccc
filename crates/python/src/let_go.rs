//! Letting go of an asyncio task the kernel detached (G5): a coroutine or
//! a turn's source that ignores its cancel keeps running on its loop, and
//! `asyncio.run`, which at its end cancels every task left and waits for
//! each, would wait for it forever. Once the kernel has given up on it, the
//! loop is told to stop counting it among its tasks (`_bridge.let_go`).

use std::sync::Arc;

use pyo3::prelude::*;

use crate::awaitable::bridge;
use crate::deliver::{Landing, Mailbox};

/// What holds an asyncio task the kernel waits for: a settle task's, or a
/// turn's pump.
pub(crate) trait HoldsTask: Send + Sync + 'static {
    /// The loop the task runs on.
    fn mailbox(&self) -> &Arc<Mailbox>;
    /// The task, while it has not ended.
    fn task<'py>(&self, py: Python<'py>) -> Option<Bound<'py, PyAny>>;
}

/// Armed while the kernel waits for an asyncio task's end; dropped armed
/// (the kernel gave up waiting: the settle deadline passed, or it stopped),
/// it lets go of the task on its loop, if the task has not ended by then.
pub(crate) struct LetGoUnlessEnded {
    holder: Option<Arc<dyn HoldsTask>>,
}

impl LetGoUnlessEnded {
    /// Armed for the task `holder` holds.
    pub fn new(holder: Arc<dyn HoldsTask>) -> Self {
        LetGoUnlessEnded {
            holder: Some(holder),
        }
    }

    /// The task ended in time: nothing to let go of.
    pub fn ended(mut self) {
        self.holder = None;
    }
}

impl Drop for LetGoUnlessEnded {
    fn drop(&mut self) {
        if let Some(holder) = self.holder.take() {
            let_go(holder);
        }
    }
}

/// Lets go of the task `holder` holds, on its loop, if it has not ended by
/// then.
pub(crate) fn let_go(holder: Arc<dyn HoldsTask>) {
    let mailbox = holder.mailbox().clone();
    mailbox.post(move |py, landing| {
        let Landing::Loop(_) = landing else {
            return;
        };
        let Some(task) = holder.task(py) else {
            return;
        };
        if let Err(error) = bridge(py).and_then(|b| b.call_method1("let_go", (task,))) {
            tracing::debug!(%error, "could not let go of a detached task");
        }
    });
}
