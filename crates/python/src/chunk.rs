//! Chunks between Python and the kernel: what a turn's iterator may yield,
//! and the `settle.Chunk` a turn gives back.
//!
//! An item of a turn's iterator (after the caller's `to_chunk`, if any) is
//! read as:
//!
//! | item | chunks |
//! |---|---|
//! | `str` | one text chunk (an empty string: none) |
//! | `settle.Chunk` | itself |
//! | `None` | none (a keepalive) |
//! | a list or tuple | each element, in order |
//! | an OpenAI-shaped chunk: the `openai` package's `ChatCompletionChunk`, or the same as a dict | as the Rust OpenAI provider reads one (`settle_stream::OpenAiChunks`): one with no `choices`, `usage` or `error` (a server's keepalive) none, `choices[0].delta.reasoning_content` (or `reasoning`) a reasoning chunk, `delta.content` text, each of `delta.tool_calls` a tool-call chunk, `usage` a usage chunk; an `error` fails the turn; a `finish_reason` of `length` or `content_filter` fails it `truncated` at the stream's end (the usage after it still counts), and `stop` says the reply is whole (a cancel after it, a budget its usage exhausts, cuts nothing: `completed`); a stream that ends after a chunk with a choice and before any `finish_reason` fails `protocol` (the reply may be cut short) |
//!
//! Anything else is refused with `settle.BadInput` (and fails the turn,
//! saying why): pass `to_chunk=` to read it. So is a string anywhere in an
//! item that is not UTF-8 (a lone surrogate), but for a character split
//! across two items: the high half a string ends with and the low half the
//! next string in the same place starts with are one character
//! ([`SplitSurrogates`]).

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString, PyTuple};
use settle_core::ChunkKind;
use settle_stream::{Chunk, OpenAiChunks, StreamError, StreamEvent};

use crate::args::Text;
use crate::convert;
use crate::split_surrogates::SplitSurrogates;

/// One piece of a turn's output, as the store acknowledged it: text, or a
/// structured chunk (reasoning, a tool-call piece, usage, data).
#[pyclass(name = "Chunk", module = "settle", frozen)]
pub(crate) struct PyChunk {
    pub chunk: Chunk,
}

#[pymethods]
impl PyChunk {
    /// A chunk of `kind` (`"text"`, `"reasoning"`, `"tool_call"`, `"usage"`,
    /// `"data"`...) carrying `data`: a string for text, any JSON-like value
    /// for the others. What a `to_chunk` callable may return. Raises
    /// `BadInput` for a kind that is not one, text that is not a `str`, or
    /// a string in either that is not UTF-8 (a lone surrogate).
    #[new]
    fn new(kind: Text, data: &Bound<'_, PyAny>) -> PyResult<Self> {
        let Text(kind) = kind;
        let kind: ChunkKind = kind
            .parse()
            .map_err(|e| crate::errors::BadInput::new_err(format!("{e}")))?;
        // Text is a string: a number or a list would be stored as its JSON
        // text, which nobody meant.
        if kind == ChunkKind::Text && !data.is_instance_of::<PyString>() {
            return Err(crate::errors::BadInput::new_err(format!(
                "a text chunk carries a str, not {}; pass the text, or another kind (\"data\") for a value",
                data.get_type().name()?
            )));
        }
        let value = convert::to_json(data)?;
        Ok(PyChunk {
            chunk: Chunk::json(kind, &value),
        })
    }

    /// What it carries: `"text"`, `"reasoning"`, `"tool_call"`, `"usage"`, ...
    #[getter]
    fn kind(&self) -> &'static str {
        self.chunk.kind().as_str()
    }

    /// The text of a text chunk; `None` for the other kinds.
    #[getter]
    fn text(&self) -> Option<&str> {
        self.chunk.as_text()
    }

    /// The payload: the text of a text chunk, the parsed JSON of the others.
    #[getter]
    fn data<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        convert::from_json(py, &self.chunk.to_json())
    }

    fn __repr__(&self) -> String {
        format!(
            "Chunk({:?}, {:?})",
            self.chunk.kind().as_str(),
            self.chunk.payload()
        )
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<PyChunk>()
            .is_ok_and(|other| other.get().chunk == self.chunk)
    }
}

/// What `item` stands for (the table of the module's doc), read into
/// `out` (its chunks, and [`StreamEvent::Finished`] when an OpenAI-shaped
/// chunk says the reply is whole), and the error the turn's stream ends
/// with after them, if the item says one (an OpenAI-shaped chunk's
/// `error`, as `quote` tells it). `reply` reads the turn's OpenAI-shaped
/// chunks as the Rust provider reads them, a cut included (told at the
/// stream's end).
pub(crate) fn chunks_of(
    item: &Bound<'_, PyAny>,
    out: &mut Vec<StreamEvent>,
    reply: &mut Reading,
    quote: &dyn Fn(&str) -> String,
) -> PyResult<Option<StreamError>> {
    chunks_at(item, out, reply, quote, 0)
}

/// What a turn's source said so far, for reading its next item: its
/// OpenAI-shaped chunks as the Rust provider reads them, and the first half
/// of a character split across two of its strings.
#[derive(Debug, Default)]
pub(crate) struct Reading {
    /// The reply its OpenAI-shaped chunks make.
    pub chunks: OpenAiChunks,
    /// A character its last string in a place ended half-way through.
    pub split: SplitSurrogates,
}

/// [`chunks_of`] for an item `depth` lists or tuples deep. A list that
/// holds itself, or lists nested past [`convert::MAX_DEPTH`], fail the turn
/// instead of recursing until the thread's stack runs out.
fn chunks_at(
    item: &Bound<'_, PyAny>,
    out: &mut Vec<StreamEvent>,
    reply: &mut Reading,
    quote: &dyn Fn(&str) -> String,
    depth: usize,
) -> PyResult<Option<StreamError>> {
    if item.is_none() {
        return Ok(None);
    }
    if let Ok(text) = item.cast::<PyString>() {
        // A lone surrogate fails the turn with `BadInput`, as the same
        // string inside an OpenAI-shaped chunk does, unless it is half of
        // a character the next `str` completes.
        let text = reply.split.text(text, &[])?;
        if !text.is_empty() {
            out.push(StreamEvent::Chunk(Chunk::text(text)));
        }
        return Ok(None);
    }
    if let Ok(chunk) = item.cast::<PyChunk>() {
        out.push(StreamEvent::Chunk(chunk.get().chunk.clone()));
        return Ok(None);
    }
    let nested = || {
        crate::errors::BadInput::new_err(format!(
            "a turn's iterator yielded lists or tuples nested deeper than {} levels \
             (or a list that holds itself); yield each chunk, or a flat list of them",
            convert::MAX_DEPTH
        ))
    };
    if let Ok(list) = item.cast::<PyList>() {
        if depth >= convert::MAX_DEPTH {
            return Err(nested());
        }
        for each in list.iter() {
            if let Some(end) = chunks_at(&each, out, reply, quote, depth + 1)? {
                return Ok(Some(end));
            }
        }
        return Ok(None);
    }
    if let Ok(tuple) = item.cast::<PyTuple>() {
        if depth >= convert::MAX_DEPTH {
            return Err(nested());
        }
        for each in tuple.iter() {
            if let Some(end) = chunks_at(&each, out, reply, quote, depth + 1)? {
                return Ok(Some(end));
            }
        }
        return Ok(None);
    }
    if item.is_instance_of::<PyDict>() || item.hasattr("model_dump")? {
        let value = convert::to_json_joining(item, &mut reply.split)?;
        if value.get("choices").is_some()
            || value.get("usage").is_some()
            || value.get("error").is_some()
            || is_openai_chunk(item, &value)?
        {
            // Read as the Rust provider reads the same chunk in an SSE event.
            for event in reply.chunks.read(&value, quote) {
                match event {
                    Ok(StreamEvent::KeepAlive) => {}
                    Ok(event) => out.push(event),
                    Err(end) => return Ok(Some(end)),
                }
            }
            return Ok(None);
        }
    }
    let shown = item.repr().map(|r| r.to_string()).unwrap_or_default();
    Err(crate::errors::BadInput::new_err(format!(
        "a turn's iterator yielded {} ({}), which is not a str, a settle.Chunk or an \
         OpenAI-shaped chunk; pass to_chunk= to turn it into one",
        item.get_type().name()?,
        excerpt(&shown)
    )))
}

/// Whether `item` (as JSON, `value`) is plainly an OpenAI streaming chunk
/// though it has no `choices`, `usage` or `error`: an object of the
/// `openai` package's `ChatCompletionChunk` (whose dump leaves out its
/// `choices: None`), or anything that says it is one (`"object":
/// "chat.completion.chunk"`). Such a chunk (the id, model and time a
/// server sends alone as a keepalive) carries nothing, as it does for the
/// Rust provider; an item of another shape is still refused.
fn is_openai_chunk(item: &Bound<'_, PyAny>, value: &serde_json::Value) -> PyResult<bool> {
    if value.get("object").and_then(serde_json::Value::as_str) == Some("chat.completion.chunk") {
        return Ok(true);
    }
    // An object of the package's type means the package is imported: it
    // is looked up there, never imported here.
    let py = item.py();
    let modules = py
        .import(pyo3::intern!(py, "sys"))?
        .getattr(pyo3::intern!(py, "modules"))?;
    let Ok(modules) = modules.cast::<PyDict>() else {
        return Ok(false);
    };
    let Some(types) = modules.get_item("openai.types.chat")? else {
        return Ok(false);
    };
    match types.getattr(pyo3::intern!(py, "ChatCompletionChunk")) {
        Ok(kind) => item.is_instance(&kind),
        Err(_) => Ok(false),
    }
}

fn excerpt(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}…", &text[..end]),
        None => text.to_owned(),
    }
}
