//! [`Registered`]: a session a kernel call made (`register`, `child`,
//! `resume`), on its way to its caller.
//!
//! A registration runs to its end on the kernel's runtime even when the
//! asyncio task awaiting it is cancelled (a call that changes the
//! lifecycle takes effect once made). Its result is then dropped unread,
//! and with a plain handle in it, the session would stay live for the
//! kernel's life with nobody holding it. It travels in a guard instead:
//! handed to Python, the guard is given up; dropped on the way (its
//! caller cancelled or gone), it lets go of the session as a dropped guard
//! does (the core cancels it, or leaves it to a shutdown that began).

use pyo3::prelude::*;
use settle_runtime::{SessionGuard, SessionHandle};

use crate::session::PySession;
use crate::ties::Ties;

/// A session made for a caller who may be gone.
pub(crate) struct Registered {
    guard: SessionGuard,
    ties: Ties,
}

impl Registered {
    /// `handle`'s session, let go of unless its caller takes it.
    pub fn new(handle: SessionHandle, ties: Ties) -> Self {
        Registered {
            guard: handle.guard(),
            ties,
        }
    }

    /// Taken by its caller: the session is the caller's to end.
    pub fn claim(self) -> PySession {
        PySession::new(self.guard.disarm(), self.ties)
    }
}

impl<'py> IntoPyObject<'py> for Registered {
    type Target = PySession;
    type Output = Bound<'py, PySession>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Self::Output> {
        Bound::new(py, self.claim())
    }
}
