//! The store's rows as Python dicts: `kernel.sessions()` and
//! `session.transcript()`, the same facts `settle sessions --json` and
//! `settle show --json` print. Times are seconds since the Unix epoch.

use std::time::{SystemTime, UNIX_EPOCH};

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;
use settle_store::{Conversation, SessionRow, TurnRow};

use crate::chunk::PyChunk;
use crate::convert;

fn seconds(at: SystemTime) -> f64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One session's row.
pub(crate) fn session<'py>(py: Python<'py>, row: &SessionRow) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("id", row.id.get())?;
    dict.set_item("name", &row.name)?;
    dict.set_item("parent", row.parent.map(|p| p.get()))?;
    dict.set_item("state", row.state.as_str())?;
    dict.set_item("outcome", row.outcome.map(|o| o.as_str()))?;
    dict.set_item("end_reason", row.end_reason.map(|r| r.as_str()))?;
    dict.set_item("turns", row.turns)?;
    dict.set_item("chunks", row.chunks)?;
    dict.set_item("created_at", seconds(row.created_at))?;
    dict.set_item("finalized_at", row.finalized_at.map(seconds))?;
    dict.set_item("resumed_from", row.resumed_from.map(|p| p.get()))?;
    // Where clients reach the live process that owns it (the address it
    // advertised); `None` once finalized or released, or when its owner
    // advertised nothing or lost its lease.
    dict.set_item("owner", row.owner.as_deref())?;
    Ok(dict)
}

/// Every row, in order.
pub(crate) fn sessions<'py>(py: Python<'py>, rows: &[SessionRow]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for row in rows {
        list.append(session(py, row)?)?;
    }
    Ok(list)
}

/// One turn: its number, outcome, times, input (`sent`: all it was sent,
/// which the store rebuilds from what each turn added), reply text, error
/// and chunks.
fn turn<'py>(
    py: Python<'py>,
    row: &TurnRow,
    sent: Option<&[Value]>,
) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("no", row.no)?;
    dict.set_item("outcome", row.outcome.map(|o| o.as_str()))?;
    dict.set_item("started_at", seconds(row.started_at))?;
    dict.set_item("ended_at", row.ended_at.map(seconds))?;
    let input = match sent {
        Some(sent) => convert::from_json(py, &Value::Array(sent.to_vec()))?,
        None => py.None().into_bound(py),
    };
    dict.set_item("input", input)?;
    dict.set_item("text", row.text())?;
    let error = match &row.error {
        Some(error) => {
            let e = PyDict::new(py);
            e.set_item("kind", error.kind.as_str())?;
            e.set_item("message", &error.message)?;
            e.into_any()
        }
        None => py.None().into_bound(py),
    };
    dict.set_item("error", error)?;
    let chunks = PyList::empty(py);
    for chunk in &row.chunks {
        let payload = match &chunk.data {
            Some(data) => data.to_string(),
            None => chunk.text.clone(),
        };
        match settle_stream::Chunk::from_parts(chunk.kind, payload) {
            Ok(chunk) => chunks.append(PyChunk { chunk })?,
            Err(_) => chunks.append(&chunk.text)?,
        }
    }
    dict.set_item("chunks", chunks)?;
    Ok(dict)
}

/// A session's turns, in order, each `input` all that the turn was sent
/// (the store keeps what each turn added to the conversation; a
/// [`Conversation`] walk gives the whole back, as `settle show` prints it).
pub(crate) fn transcript<'py>(py: Python<'py>, turns: &[TurnRow]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    let mut conversation = Conversation::new();
    for row in turns {
        let sent = conversation.turn(row);
        list.append(turn(py, row, sent)?)?;
    }
    Ok(list)
}
