//! Arguments read as the package's errors say: a number out of its range
//! (`-1` for an id, `2**70`) and a string Python cannot encode as UTF-8 (a
//! lone surrogate) raise `settle.BadInput`, like every other bad argument,
//! not the `OverflowError` and `UnicodeEncodeError` PyO3's own conversions
//! raise. (A value of the wrong type still raises `TypeError`, as Python's
//! own functions do.)

use std::path::PathBuf;

use pyo3::exceptions::{PyOverflowError, PyUnicodeEncodeError};
use pyo3::prelude::*;
use pyo3::types::PyString;
use pyo3::Borrowed;

use crate::errors::BadInput;

/// A whole number from 0 to `T`'s largest: an id, a count, a cap.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Whole<T>(pub T);

impl<'a, 'py, T> FromPyObject<'a, 'py> for Whole<T>
where
    T: for<'b> FromPyObject<'b, 'py, Error = PyErr> + Bounded,
{
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<T>() {
            Ok(value) => Ok(Whole(value)),
            Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
                let shown = obj.repr().map(|r| r.to_string()).unwrap_or_default();
                Err(BadInput::new_err(format!(
                    "{} is out of range: a whole number from 0 to {} is expected",
                    excerpt(&shown),
                    T::LARGEST
                )))
            }
            Err(e) => Err(e),
        }
    }
}

/// The largest value of an unsigned integer type, for the message.
pub(crate) trait Bounded {
    const LARGEST: u64;
}

impl Bounded for u32 {
    const LARGEST: u64 = u32::MAX as u64;
}

impl Bounded for u64 {
    const LARGEST: u64 = u64::MAX;
}

impl Bounded for usize {
    const LARGEST: u64 = usize::MAX as u64;
}

/// A string that can be stored: valid UTF-8.
#[derive(Debug, Clone)]
pub(crate) struct Text(pub String);

impl<'a, 'py> FromPyObject<'a, 'py> for Text {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        match obj.extract::<String>() {
            Ok(text) => Ok(Text(text)),
            Err(e) if e.is_instance_of::<PyUnicodeEncodeError>(obj.py()) => Err(not_utf8(&obj)),
            Err(e) => Err(e),
        }
    }
}

/// Where a store is: a path, as a `str` or an `os.PathLike[str]` (a
/// `pathlib.Path`), or a URL (`postgres://...`).
#[derive(Debug, Clone)]
pub(crate) struct StorePath(pub String);

impl<'a, 'py> FromPyObject<'a, 'py> for StorePath {
    type Error = PyErr;

    fn extract(obj: Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if obj.is_instance_of::<PyString>() {
            return obj.extract::<Text>().map(|Text(text)| StorePath(text));
        }
        // An `os.PathLike`: its `__fspath__()`, as PyO3 reads a path.
        let path: PathBuf = obj.extract()?;
        path.into_os_string()
            .into_string()
            .map(StorePath)
            .map_err(|path| {
                BadInput::new_err(format!(
                    "the store's path {:?} is not UTF-8 (a lone surrogate, or bytes \
                     of another encoding); give one that is",
                    path.to_string_lossy()
                ))
            })
    }
}

/// The error of `text`, a string with a lone surrogate: which one, and where.
pub(crate) fn not_utf8(text: &Bound<'_, PyAny>) -> PyErr {
    let which = match first_surrogate(text) {
        Some((at, code)) => format!("'\\u{code:04x}' at character {at}"),
        None => "such as '\\udc80'".to_string(),
    };
    BadInput::new_err(format!(
        "a string holds a lone surrogate ({which}), which is not UTF-8 and \
         cannot be stored; decode bytes with errors='replace' or 'strict' first"
    ))
}

/// The first lone surrogate of `text` (its place in characters, its code).
fn first_surrogate(text: &Bound<'_, PyAny>) -> Option<(usize, u32)> {
    let wide = text
        .call_method1(
            pyo3::intern!(text.py(), "encode"),
            ("utf-32-le", "surrogatepass"),
        )
        .ok()?;
    let bytes = wide.cast::<pyo3::types::PyBytes>().ok()?.as_bytes();
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .enumerate()
        .find(|(_, code)| (0xD800..=0xDFFF).contains(code))
}

/// The start of a long repr.
fn excerpt(text: &str) -> &str {
    match text.char_indices().nth(40) {
        Some((at, _)) => &text[..at],
        None => text,
    }
}
