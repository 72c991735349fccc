//! A settle task's end, kept for every awaiter: like an `asyncio.Task`, a
//! `settle.Task` may be awaited by several callers at once and again after
//! it ended, and each is told the same (its value, or the same exception).
//!
//! The first awaiter waits on the kernel's handle; the end is kept once it
//! has it, and each awaiter's copy of it is made on its own loop's thread,
//! where the GIL already is: no kernel thread waits for the GIL to share it.

use std::sync::Arc;

use pyo3::prelude::*;
use settle_runtime::{TaskHandle, WorkCanceller};
use tokio::sync::{Mutex, OnceCell};

use crate::errors;

/// How the coroutine ended, as its asyncio task reports it.
pub(crate) enum Ended {
    Returned(Py<PyAny>),
    Raised(PyErr),
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
pub(crate) struct Told(Arc<PyResult<Py<PyAny>>>);

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
                let ended = match (&mut *handle).await {
                    Ok(Ended::Returned(value)) => Ok(value),
                    Ok(Ended::Raised(error)) => Err(error),
                    Ok(Ended::Cancelled) => Err(errors::Cancelled::new_err(
                        "the task was cancelled and gave no result",
                    )),
                    Err(error) => Err(errors::task(error)),
                };
                Told(Arc::new(ended))
            })
            .await
            .clone()
    }
}

impl<'py> IntoPyObject<'py> for Told {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    /// The value, or the same exception raised again.
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        match &*self.0 {
            Ok(value) => Ok(value.bind(py).clone()),
            Err(error) => Err(error.clone_ref(py)),
        }
    }
}
