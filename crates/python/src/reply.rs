//! A turn's reply, its tool calls and a conversation's messages as Python
//! values: what `Turn.tool_calls()`, `Turn.reply()` and `Kernel.resume()`
//! give back.
//!
//! - A tool call is `{"id", "name", "arguments"}`, as [`ToolCall`] has it:
//!   `arguments` is the text its streamed pieces made, unparsed (a model can
//!   write invalid JSON; `json.loads` it where a tool wants it).
//! - A reply is `{"text", "reasoning", "tool_calls", "usage", "data"}`, as
//!   [`Reply`] has it, and `message`: the reply as the assistant message to
//!   send back on the next turn ([`Reply::to_message`]; `content` `None`
//!   when it only calls tools, as the `openai` package spells it).
//! - A message is `{"role", "content"}`, with `tool_calls` (the
//!   chat-completion spelling, `[{"id", "type", "function": {"name",
//!   "arguments"}}]`) and `tool_call_id` when it has them: the spelling of a
//!   turn's `input` in `session.transcript()`, and what `input=` takes back.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use settle_stream::{Message, Reply, ToolCall};

use crate::convert;
use crate::errors;

/// One tool call, whole.
pub(crate) fn tool_call<'py>(py: Python<'py>, call: &ToolCall) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("id", &call.id)?;
    dict.set_item("name", &call.name)?;
    dict.set_item("arguments", &call.arguments)?;
    Ok(dict)
}

/// Tool calls, in the order they began.
pub(crate) fn tool_calls<'py>(py: Python<'py>, calls: &[ToolCall]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for call in calls {
        list.append(tool_call(py, call)?)?;
    }
    Ok(list)
}

/// A reply: its text, reasoning, tool calls, usage reports and other data.
pub(crate) fn reply<'py>(py: Python<'py>, reply: &Reply) -> PyResult<Bound<'py, PyDict>> {
    let dict = PyDict::new(py);
    dict.set_item("text", &reply.text)?;
    dict.set_item("reasoning", &reply.reasoning)?;
    dict.set_item("tool_calls", tool_calls(py, &reply.tool_calls)?)?;
    let values = |values: &[serde_json::Value]| -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for value in values {
            list.append(convert::from_json(py, value)?)?;
        }
        Ok(list)
    };
    dict.set_item("usage", values(&reply.usage)?)?;
    dict.set_item("data", values(&reply.data)?)?;
    dict.set_item("message", assistant(py, reply)?)?;
    Ok(dict)
}

/// The reply as the assistant message of the conversation; one that only
/// calls tools has `content: None`, as the `openai` package's own types
/// spell it (and some servers require).
fn assistant<'py>(py: Python<'py>, reply: &Reply) -> PyResult<Bound<'py, PyAny>> {
    let message = message(py, &reply.to_message())?;
    if reply.text.is_empty() && !reply.tool_calls.is_empty() {
        message.set_item("content", py.None())?;
    }
    Ok(message)
}

/// One message, as a turn's stored input spells it.
fn message<'py>(py: Python<'py>, message: &Message) -> PyResult<Bound<'py, PyAny>> {
    let value = serde_json::to_value(message)
        .map_err(|e| errors::error(format!("a message could not be read: {e}")))?;
    convert::from_json(py, &value)
}

/// Messages, oldest first, as a turn's stored input spells them.
pub(crate) fn messages<'py>(py: Python<'py>, messages: &[Message]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for one in messages {
        list.append(message(py, one)?)?;
    }
    Ok(list)
}
