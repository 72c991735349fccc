//! `settle.Resumed`: what `Kernel.resume()` gives, a new session that
//! continues a finalized one, with the conversation to send with its next
//! turn (the runtime's [`Resumed`]).

use pyo3::prelude::*;
use pyo3::types::PyList;
use pyo3::{PyTraverseError, PyVisit};
use settle_runtime::Resumed;
use settle_stream::{Message, ToolCall};

use crate::session::PySession;
use crate::ties::Ties;

/// A new session that continues a finalized one: `session`, the one it
/// continues (`resumed_from`, also on its row in `kernel.sessions()`), the
/// conversation so far (`history`) and the tool calls of its last reply
/// that no tool has answered yet (`pending_tool_calls`). Run those, and
/// send `history` with their results (`{"role": "tool", "content",
/// "tool_call_id"}`) as the next turn's `input=`.
#[pyclass(name = "Resumed", module = "settle", frozen)]
pub(crate) struct PyResumed {
    session: Py<PySession>,
    from: u64,
    history: Py<PyList>,
    pending: Py<PyList>,
}

#[pymethods]
impl PyResumed {
    /// The new session (open; registered as a root).
    #[getter]
    fn session(&self, py: Python<'_>) -> Py<PySession> {
        self.session.clone_ref(py)
    }

    /// The id of the session it continues.
    #[getter]
    fn resumed_from(&self) -> u64 {
        self.from
    }

    /// The messages of the session it continues, oldest first, as dicts
    /// spelled as a turn's `input` in `session.transcript()`: `role` and
    /// `content`, with `tool_calls` (`[{"id", "type", "function": {"name",
    /// "arguments"}}]`), `tool_call_id` and `name` when a message has
    /// them. They are what its last turn that had an input was sent, then
    /// that turn's reply unless it failed; a reply that asked for tools is
    /// the assistant message with its tool calls. A reply cut short (its
    /// turn cancelled, or interrupted by a crash) is given as far as it was
    /// stored, as the model's message: check the session's last turn
    /// (`transcript()`) to drop or mark it. `[]` when it ran no turn with
    /// an input.
    #[getter]
    fn history(&self, py: Python<'_>) -> Py<PyList> {
        self.history.clone_ref(py)
    }

    /// The tool calls of that last reply, which no tool has answered yet,
    /// as `Turn.tool_calls()` gives them: `{"id", "name", "arguments"}`
    /// dicts; `[]` when the reply asked for none, or did not complete (a
    /// turn cancelled or cut by a crash may have lost the end of a call).
    #[getter]
    fn pending_tool_calls(&self, py: Python<'_>) -> Py<PyList> {
        self.pending.clone_ref(py)
    }

    // The lists are the caller's to change (a `Resumed` put in its own
    // `history` is a cycle): the collector sees what it holds.
    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        visit.call(&self.session)?;
        visit.call(&self.history)?;
        visit.call(&self.pending)
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "<settle.Resumed session {} from {}: {} messages, {} pending tool calls>",
            self.session.get().id_value(),
            self.from,
            self.history.bind(py).len(),
            self.pending.bind(py).len()
        )
    }
}

/// A resumption on its way to Python.
pub(crate) struct Resumption {
    session: crate::registered::Registered,
    from: u64,
    history: Vec<Message>,
    pending: Vec<ToolCall>,
}

impl Resumption {
    /// `resumed`, its session keeping `ties` of its kernel.
    pub fn new(resumed: Resumed, ties: Ties) -> Resumption {
        Resumption {
            from: resumed.from.get(),
            history: resumed.history,
            pending: resumed.pending_tool_calls,
            session: crate::registered::Registered::new(resumed.session, ties),
        }
    }
}

impl<'py> IntoPyObject<'py> for Resumption {
    type Target = PyResumed;
    type Output = Bound<'py, PyResumed>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        // Converted first: the session is claimed only once the rest of
        // the answer is on its way.
        let history = crate::reply::messages(py, &self.history)?.unbind();
        let pending = crate::reply::tool_calls(py, &self.pending)?.unbind();
        let resumed = PyResumed {
            session: Py::new(py, self.session.claim())?,
            from: self.from,
            history,
            pending,
        };
        Bound::new(py, resumed)
    }
}
