//! A turn's next chunk when the kernel already has it: `Turn.__anext__`
//! gives it back without a round trip through the runtime's threads.
//!
//! A read that has to wait goes through the bridge (`awaitable.rs`): a task
//! on the runtime waits for the chunk, and its result reaches the loop
//! through the mailbox, so every such read wakes two other threads and the
//! loop. When the reader is behind its stream (a provider that sends a
//! burst, a reader that does work per chunk), the next chunk is already
//! persisted and waiting in the turn's channel; it is then taken at once
//! (`Turn::try_next_chunk`) and handed back in a [`Ready`].
//!
//! A [`Ready`] is also a coroutine in the sense `asyncio` checks (`send`,
//! `throw`, `close`, as `collections.abc.Coroutine` asks), as the read that
//! waits is (`_bridge.Next`): `asyncio.create_task(turn.__anext__())` runs
//! it as it runs the coroutine an `openai` stream's `__anext__` gives.

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
use pyo3::types::PyType;
use settle_stream::Chunk;

use crate::awaitable::pass_once;
use crate::chunk::PyChunk;
use crate::turn::{cancel_at_once, PyTurn};

/// The awaitable of a chunk taken without waiting. Awaiting it passes the
/// event loop once (its task waits on a future that is done already, and
/// resumes at the loop's next pass, as after `asyncio.sleep(0)`): other
/// tasks run, and a cancel of the awaiting task lands there as it would at
/// a read that waits, cancelling the turn before the canceller's next line
/// (the future's own `cancel()` does, `_bridge.CancelsAtOnce`). Then it gives the chunk, noted in the turn's reply in that
/// task's own step (as `_bridge.Next` does for a read that waited).
///
/// Dropped before it gave its chunk (its task was cancelled at that pass,
/// or it was never awaited and was collected), it cancels the turn, as the
/// collected or cancelled awaitable of a read that waits does: the chunk is
/// stored all the same, never seen, and no part of the reply.
#[pyclass(module = "settle._settle")]
pub(crate) struct Ready {
    /// The chunk, until it is given.
    chunk: Option<Chunk>,
    /// Whether the loop was passed once.
    passed: bool,
    /// The turn it was read from.
    turn: Py<PyTurn>,
}

impl Ready {
    /// The read of `chunk`, taken from `turn` without waiting.
    pub(crate) fn new(chunk: Chunk, turn: Py<PyTurn>) -> Self {
        Ready {
            chunk: Some(chunk),
            passed: false,
            turn,
        }
    }

    /// The read ends without giving its chunk: the turn is cancelled, as
    /// for a read dropped first (see `Drop`).
    fn give_up(&mut self) {
        if self.chunk.take().is_some() {
            // In a forked child there is no runtime to cancel it on, and
            // nothing to do (see `Drop`).
            let _ = self.turn.get().cancel_soon();
        }
    }
}

/// What `throw(error, value)` raises, as a generator's `throw` would: an
/// exception instance as it is; a class, made with `value` (itself when it
/// is one of the class already).
fn thrown(error: Bound<'_, PyAny>, value: Option<Bound<'_, PyAny>>) -> PyErr {
    if error.cast::<PyType>().is_err() {
        return PyErr::from_value(error);
    }
    let made = match value {
        Some(value) if value.is_instance(&error).unwrap_or(false) => Ok(value),
        Some(value) if !value.is_none() => error.call1((value,)),
        _ => error.call0(),
    };
    match made {
        Ok(made) => PyErr::from_value(made),
        Err(failed) => failed,
    }
}

#[pymethods]
impl Ready {
    fn __await__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// First a future that is done (one pass of the loop), then the chunk
    /// as the value of `StopIteration`.
    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<Py<PyAny>>> {
        if !self.passed {
            self.passed = true;
            let at_once = cancel_at_once(self.turn.bind(py))?;
            return Ok(Some(pass_once(py, at_once)?.unbind()));
        }
        // Awaited again after it gave its chunk: nothing more.
        let Some(chunk) = self.chunk.take() else {
            return Ok(None);
        };
        self.turn.get().saw(&chunk);
        let chunk = Py::new(py, PyChunk { chunk })?;
        Err(PyStopIteration::new_err((chunk,)))
    }

    /// A step of a task that runs this read as its coroutine, as
    /// `__next__` (a read takes nothing sent in).
    fn send(&mut self, py: Python<'_>, _value: &Bound<'_, PyAny>) -> PyResult<Option<Py<PyAny>>> {
        self.__next__(py)
    }

    /// A cancel (or another exception) thrown into the read by its task:
    /// the read gives no chunk and the turn is cancelled, as when the task
    /// awaiting it is cancelled; then the exception is raised.
    #[pyo3(signature = (error, value = None, _traceback = None))]
    fn throw(
        &mut self,
        error: Bound<'_, PyAny>,
        value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.give_up();
        Err(thrown(error, value))
    }

    /// Closed before it gave its chunk: the turn is cancelled, as when the
    /// read is dropped. Nothing once it has given it.
    fn close(&mut self) {
        self.give_up();
    }
}

impl Drop for Ready {
    fn drop(&mut self) {
        if self.chunk.is_some() {
            // As a read that waits and is cancelled. A drop has no caller
            // to tell: in a forked child (the turn is its parent's) there
            // is no runtime to cancel it on, and nothing to do.
            let _ = self.turn.get().cancel_soon();
        }
    }
}
