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

/// How the coroutine ended, as its asyncio task reports it to the kernel:
/// what it returned or raised is in its [`Given`], not in the kernel's
/// channel, where the collector could not see it. A coroutine that raised
/// is recorded `failed`, its end announced with the name of its
/// exception's class (never its words, which may hold a secret); one that
/// raised `CancelledError` of
/// its own `cancelled` (the kernel's cancel is recorded so whatever it
/// reports).
pub(crate) enum Ended {
    Returned,
    /// The qualified name of the class of what it raised.
    Raised(String),
    Cancelled,
}

impl settle_runtime::TaskOutcome for Ended {
    fn task_outcome(&self) -> Result<(), settle_runtime::TaskFailure> {
        match self {
            Ended::Returned => Ok(()),
            Ended::Raised(class) => Err(settle_runtime::TaskFailure::Failed(format!(
                "the coroutine raised {class}"
            ))),
            Ended::Cancelled => Err(settle_runtime::TaskFailure::Cancelled),
        }
    }
}

/// The name a raised exception's end is announced with: its class's qualified name,
/// with its module unless it is a builtin (`ValueError`,
/// `openai.APIConnectionError`).
pub(crate) fn class_name(error: &Bound<'_, PyAny>) -> String {
    let class = error.get_type();
    let name = class
        .qualname()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "an exception".to_owned());
    match class.module().map(|m| m.to_string()) {
        Ok(module) if module != "builtins" => format!("{module}.{name}"),
        _ => name,
    }
}

/// What the coroutine gave (its value, or the exception it raised with
/// the traceback it had then), put here by its asyncio task before it
/// reports its end, and kept for every awaiter. Its settle.Task shows it
/// to the collector ([`traverse`](Self::traverse)) from the moment it is
/// here, awaited or not, as an `asyncio.Task` shows its result and
/// exception: a cycle through it (an exception whose traceback holds a
/// frame that holds the task, a result that holds its task) is collected.
#[derive(Default)]
pub(crate) struct Given(std::sync::Mutex<Option<Gave>>);

enum Gave {
    Value(Py<PyAny>),
    Raised {
        exception: Py<PyAny>,
        traceback: Option<Py<PyAny>>,
    },
}

impl Given {
    /// The coroutine returned `value`.
    pub fn returned(&self, value: Py<PyAny>) {
        self.put(Gave::Value(value));
    }

    /// The coroutine raised `exception` (an instance).
    pub fn raised(&self, exception: &Bound<'_, PyAny>) {
        let traceback = exception
            .getattr(pyo3::intern!(exception.py(), "__traceback__"))
            .ok()
            .filter(|tb| !tb.is_none())
            .map(Bound::unbind);
        self.put(Gave::Raised {
            exception: exception.clone().unbind(),
            traceback,
        });
    }

    fn put(&self, gave: Gave) {
        let mut slot = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        *slot = Some(gave);
    }

    /// Shows the collector what is kept (a settle.Task's `__traverse__`;
    /// only its task visits it). Skipped while it is being read:
    /// traversal must not wait.
    pub fn traverse(&self, visit: &PyVisit<'_>) -> Result<(), PyTraverseError> {
        let Ok(slot) = self.0.try_lock() else {
            return Ok(());
        };
        match &*slot {
            Some(Gave::Value(value)) => visit.call(value),
            Some(Gave::Raised {
                exception,
                traceback,
            }) => {
                visit.call(exception)?;
                visit.call(traceback)
            }
            None => Ok(()),
        }
    }

    /// The value, or the exception raised again with the traceback it had
    /// when the coroutine raised it (as `asyncio.Task.result()` does: an
    /// exception raised to many awaiters does not grow a traceback entry
    /// each).
    fn hand<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let (value, exception, traceback) = {
            let slot = self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            match &*slot {
                Some(Gave::Value(value)) => (Some(value.bind(py).clone()), None, None),
                Some(Gave::Raised {
                    exception,
                    traceback,
                }) => (
                    None,
                    Some(exception.bind(py).clone()),
                    traceback.as_ref().map(|tb| tb.bind(py).clone()),
                ),
                None => (None, None, None),
            }
        };
        match (value, exception) {
            (Some(value), _) => Ok(value),
            (None, Some(exception)) => {
                let traceback = traceback.unwrap_or_else(|| py.None().into_bound(py));
                let _ = exception.call_method1(pyo3::intern!(py, "with_traceback"), (traceback,));
                Err(PyErr::from_value(exception))
            }
            (None, None) => Err(errors::error("the task's end was not kept")),
        }
    }
}

/// What the awaiters of one task share: its handle, what cancels it while
/// an awaiter holds the handle, and its end once known.
pub(crate) struct TaskEnd {
    handle: Mutex<TaskHandle<Ended>>,
    canceller: WorkCanceller,
    given: Arc<Given>,
    end: OnceCell<Told>,
}

/// The end as awaiters are told it, handed to Python as is, once per awaiter.
#[derive(Clone)]
pub(crate) struct Told(Arc<Kept>);

enum Kept {
    /// What the coroutine gave: every awaiter gets the same value, or the
    /// same exception, as from an `asyncio.Task`.
    Given(Arc<Given>),
    /// The kernel's word (it was cancelled, detached, or the kernel
    /// stopped): each awaiter gets an exception of its own, as each
    /// awaiter of a cancelled `asyncio.Task` gets a `CancelledError` of
    /// its own, so that none is kept where a traceback could tie it.
    Said(fn(String) -> PyErr, String),
}

impl TaskEnd {
    pub fn new(handle: TaskHandle<Ended>, given: Arc<Given>) -> Self {
        TaskEnd {
            canceller: handle.canceller(),
            handle: Mutex::new(handle),
            given,
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
                    Ok(Ended::Returned | Ended::Raised(_)) => Kept::Given(self.given.clone()),
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
}

impl<'py> IntoPyObject<'py> for Told {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    /// The value, or the exception raised again.
    fn into_pyobject(self, py: Python<'py>) -> Result<Self::Output, Self::Error> {
        match &*self.0 {
            Kept::Given(given) => given.hand(py),
            Kept::Said(class, message) => Err(class(message.clone())),
        }
    }
}
