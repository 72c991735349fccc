//! A settle task's end, kept for every awaiter: like an `asyncio.Task`, a
//! `settle.Task` may be awaited by several callers at once and again after
//! it ended, and each is told the same (its value, or the same exception it
//! raised; the kernel's word, a cancel or a detach, as an exception of its
//! own each).
//!
//! The first awaiter waits on the kernel's handle; the end is kept once it
//! has it, and each awaiter's copy of it is made on its own loop's thread,
//! where the GIL already is: no kernel thread waits for the GIL to share it.

use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::{PyTraverseError, PyVisit};
use settle_runtime::{TaskHandle, WorkCanceller};
use tokio::sync::{Mutex, OnceCell};

use crate::errors;

/// How the coroutine ended, as its asyncio task reports it.
pub(crate) enum Ended {
    Returned(Py<PyAny>),
    /// The exception it raised (an instance).
    Raised(Py<PyAny>),
    Cancelled,
}

/// What the awaiters of one task share: its handle, what cancels it while
/// an awaiter holds the handle, and its end once known.
pub(crate) struct TaskEnd {
    handle: Mutex<TaskHandle<Ended>>,
    canceller: WorkCanceller,
    end: OnceCell<Told>,
}

/// The end as awaiters are told it, handed to Python as is, once per awaiter.
#[derive(Clone)]
pub(crate) struct Told(Arc<Kept>);

/// A task's end as it is kept, as Python objects the collector sees
/// ([`TaskEnd::traverse`]): an exception's traceback holds the frames
/// that awaited the task, which hold the task.
enum Kept {
    /// What the coroutine returned.
    Value(Py<PyAny>),
    /// What it raised: every awaiter gets this same exception, as from an
    /// `asyncio.Task`.
    Raised(Py<PyAny>),
    /// The kernel's word (it was cancelled, detached, or the kernel
    /// stopped): each awaiter gets an exception of its own, as each
    /// awaiter of a cancelled `asyncio.Task` gets a `CancelledError` of
    /// its own, so that none is kept where a traceback could tie it.
    Said(fn(String) -> PyErr, String),
}

impl TaskEnd {
    pub fn new(handle: TaskHandle<Ended>) -> Self {
        TaskEnd {
            canceller: handle.canceller(),
            handle: Mutex::new(handle),
            end: OnceCell::new(),
        }
    }

    /// Cancels the task (G6: not again once it has ended).
    pub fn cancel(&self) {
        self.canceller.cancel();
    }

    /// The task's end: waited for by the first awaiter (another one takes
    /// over if that one is dropped), kept for every later one.
    pub async fn told(&self) -> Told {
        self.end
            .get_or_init(|| async {
                let mut handle = self.handle.lock().await;
                // Polled again only if an earlier awaiter was dropped
                // before it had the end: the handle has not answered yet.
                let kept = match (&mut *handle).await {
                    Ok(Ended::Returned(value)) => Kept::Value(value),
                    Ok(Ended::Raised(error)) => Kept::Raised(error),
                    Ok(Ended::Cancelled) => Kept::Said(
                        errors::Cancelled::new_err,
                        "the task was cancelled and gave no result".to_owned(),
                    ),
                    Err(error) => {
                        let said = error.to_string();
                        Kept::Said(errors::task_error_class(&error), said)
                    }
                };
                Told(Arc::new(kept))
            })
            .await
            .clone()
    }

    /// Shows the collector the end this task keeps (`__traverse__`), as an
    /// `asyncio.Task` shows its result and exception: a cycle through it
    /// (an exception whose traceback holds the frame that held the task, a
    /// result that holds its task) is then collected.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        match self.end.get().map(|told| &*told.0) {
            Some(Kept::Value(object) | Kept::Raised(object)) => visit.call(object),
            Some(Kept::Said(..)) | None => Ok(()),
        }
    }
}

impl<'py> IntoPyObject<'py> for Told {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    /// The value, or the exception raised again.
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        match &*self.0 {
            Kept::Value(value) => Ok(value.bind(py).clone()),
            Kept::Raised(error) => Err(PyErr::from_value(error.bind(py).clone())),
            Kept::Said(class, message) => Err(class(message.clone())),
        }
    }
}
