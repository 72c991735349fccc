//! Python values and JSON: what a dict, a list or a pydantic model (the
//! `openai` package's types) becomes in the store, and back.

use pyo3::prelude::*;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyFloat, PyInt, PyList, PyString, PyTuple,
};
use serde_json::{Map, Number, Value};

use crate::split_surrogates::{SplitSurrogates, Step};

/// How deep a value may nest before it is refused (a cycle, or a value no
/// model sends).
pub(crate) const MAX_DEPTH: usize = 64;

/// `value` as JSON: `None`, booleans, numbers, strings, lists, tuples,
/// dicts (keys as strings), and objects with `model_dump()` (pydantic);
/// anything else as its `str()` but `bytes` and `bytearray`, whose `str()`
/// is their repr (`b'...'`), not their text: those raise `BadInput`, as
/// do a float that is NaN or infinite (JSON has neither) and a string that
/// is not UTF-8 (a lone surrogate), wherever it is and whether it is given
/// or made by `str()`.
pub(crate) fn to_json(value: &Bound<'_, PyAny>) -> PyResult<Value> {
    to_json_at(value, 0, &mut None)
}

/// [`to_json`] for an item of a turn's source: a character split across
/// one of its strings and the string in the same place of the item before
/// (`split` holds its first half) is joined ([`SplitSurrogates`]).
pub(crate) fn to_json_joining(
    value: &Bound<'_, PyAny>,
    split: &mut SplitSurrogates,
) -> PyResult<Value> {
    let mut joining = Some(Joining {
        split,
        path: Vec::new(),
    });
    to_json_at(value, 0, &mut joining)
}

/// The split characters of a source's items, and where in the item the
/// conversion is.
struct Joining<'a> {
    split: &'a mut SplitSurrogates,
    path: Vec<Step>,
}

fn to_json_at(
    value: &Bound<'_, PyAny>,
    depth: usize,
    joining: &mut Option<Joining<'_>>,
) -> PyResult<Value> {
    if depth > MAX_DEPTH {
        return Err(crate::errors::BadInput::new_err(format!(
            "a value nests deeper than {MAX_DEPTH} levels; it cannot be stored"
        )));
    }
    if value.is_none() {
        return Ok(Value::Null);
    }
    if let Ok(flag) = value.cast::<PyBool>() {
        return Ok(Value::Bool(flag.is_true()));
    }
    if value.is_instance_of::<PyInt>() {
        if let Ok(n) = value.extract::<i64>() {
            return Ok(Value::from(n));
        }
        if let Ok(n) = value.extract::<u64>() {
            return Ok(Value::from(n));
        }
        return Ok(Value::String(utf8(&value.str()?)?));
    }
    if let Ok(n) = value.cast::<PyFloat>() {
        // JSON has no NaN nor infinity: taken for `null`, a delta's content
        // would be dropped without a word and a usage count lost.
        return Number::from_f64(n.value())
            .map(Value::Number)
            .ok_or_else(|| {
                crate::errors::BadInput::new_err(format!(
                "the float {} has no JSON form (JSON has no NaN nor infinity); it cannot be stored",
                n.value()
            ))
            });
    }
    if let Ok(text) = value.cast::<PyString>() {
        return Ok(Value::String(match joining {
            Some(j) => j.split.text(text, &j.path)?,
            None => utf8(text)?,
        }));
    }
    if let Ok(list) = value.cast::<PyList>() {
        return list
            .iter()
            .enumerate()
            .map(|(at, v)| at_step(element(at, &v, joining), &v, depth, joining).map(|(_, v)| v))
            .collect();
    }
    if let Ok(tuple) = value.cast::<PyTuple>() {
        return tuple
            .iter()
            .enumerate()
            .map(|(at, v)| at_step(element(at, &v, joining), &v, depth, joining).map(|(_, v)| v))
            .collect();
    }
    if let Ok(dict) = value.cast::<PyDict>() {
        let mut map = Map::new();
        for (key, item) in dict.iter() {
            let key = match key.cast::<PyString>() {
                Ok(key) => utf8(key)?,
                Err(_) => utf8(&key.str()?)?,
            };
            let (step, value) = at_step(Step::Key(key), &item, depth, joining)?;
            if let Step::Key(key) = step {
                map.insert(key, value);
            }
        }
        return Ok(Value::Object(map));
    }
    if value.is_instance_of::<PyBytes>() || value.is_instance_of::<PyByteArray>() {
        return Err(crate::errors::BadInput::new_err(
            "a value holds bytes, which are not text: decode them (bytes.decode()) first",
        ));
    }
    if value.hasattr("model_dump")? {
        let kwargs = PyDict::new(value.py());
        kwargs.set_item("exclude_none", true)?;
        let dumped = value.call_method("model_dump", (), Some(&kwargs))?;
        return to_json_at(&dumped, depth + 1, joining);
    }
    Ok(Value::String(utf8(&value.str()?)?))
}

/// The step to the element `value` at position `at` of a list: its
/// `index` when it is a dict that has a whole one (which call a tool-call
/// piece continues), else its position; looked up only while joining.
fn element(at: usize, value: &Bound<'_, PyAny>, joining: &Option<Joining<'_>>) -> Step {
    if joining.is_none() {
        return Step::At(at);
    }
    let index = value
        .cast::<PyDict>()
        .ok()
        .and_then(|dict| dict.get_item("index").ok().flatten())
        .and_then(|index| index.extract::<usize>().ok());
    Step::At(index.unwrap_or(at))
}

/// `value`, one `step` below the value being converted: the step given
/// back (a dict's key, moved in and out of the path, not copied).
fn at_step(
    step: Step,
    value: &Bound<'_, PyAny>,
    depth: usize,
    joining: &mut Option<Joining<'_>>,
) -> PyResult<(Step, Value)> {
    let Some(j) = joining.as_mut() else {
        return Ok((step, to_json_at(value, depth + 1, joining)?));
    };
    j.path.push(step);
    let converted = to_json_at(value, depth + 1, joining);
    let step = joining
        .as_mut()
        .and_then(|j| j.path.pop())
        .unwrap_or(Step::At(0));
    Ok((step, converted?))
}

/// `value` as a Python object (through `json.loads`).
pub(crate) fn from_json<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    match value {
        Value::Null => Ok(py.None().into_bound(py)),
        Value::String(text) => Ok(PyString::new(py, text).into_any()),
        other => py
            .import("json")?
            .call_method1("loads", (other.to_string(),)),
    }
}

/// A Python string as UTF-8 for a message, never refused: a lone surrogate
/// is written as its escape (`\udc80`), as Python's `backslashreplace`
/// writes it.
pub(crate) fn utf8_escaped(text: &Bound<'_, PyString>) -> String {
    if let Ok(text) = text.to_cow() {
        return text.into_owned();
    }
    text.call_method1(
        pyo3::intern!(text.py(), "encode"),
        ("utf-8", "backslashreplace"),
    )
    .and_then(|bytes| bytes.extract::<Vec<u8>>())
    .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
    .unwrap_or_else(|_| text.to_string_lossy().into_owned())
}

/// A Python string as UTF-8; one with a lone surrogate raises `BadInput`.
pub(crate) fn utf8(text: &Bound<'_, PyString>) -> PyResult<String> {
    text.to_cow()
        .map(|text| text.into_owned())
        .map_err(|_| crate::args::not_utf8(text.as_any()))
}
