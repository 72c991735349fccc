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

use pyo3::exceptions::PyStopIteration;
use pyo3::prelude::*;
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
