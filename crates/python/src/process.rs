//! The runtime of this process: a tokio runtime on its own threads and the
//! one thread that hands results to Python, made once per process.
//!
//! A forked child inherits the parent's memory but none of its threads, so
//! the parent's runtime is dead there: every object that belongs to it
//! remembers the process id it was made in and refuses to be used in another
//! one ([`Owner::check`]), with a [`settle.Error`](crate::errors::Error)
//! instead of a hang. The runtimes are leaked, never dropped: dropping one
//! whose threads do not exist (in a child) or during interpreter exit would
//! block.

use std::sync::{Arc, Mutex};

use pyo3::PyResult;

use crate::deliver::Deliverer;
use crate::errors;

/// The runtime and the deliverer of one process.
#[derive(Clone)]
pub(crate) struct Here {
    /// The process these belong to.
    pub pid: u32,
    /// Where the kernel and every Rust future of the bindings run.
    pub runtime: &'static tokio::runtime::Runtime,
    /// Where results go to reach Python.
    pub deliver: Arc<Deliverer>,
}

static CURRENT: Mutex<Option<Here>> = Mutex::new(None);

/// This process's runtime, made on first use (again in a forked child).
pub(crate) fn here() -> PyResult<Here> {
    let pid = std::process::id();
    let mut current = CURRENT
        .lock()
        .map_err(|_| errors::error("the settle runtime's registry is poisoned"))?;
    if let Some(here) = current.as_ref().filter(|here| here.pid == pid) {
        return Ok(here.clone());
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("settle-runtime")
        .build()
        .map_err(|e| errors::error(format!("the settle runtime could not start: {e}")))?;
    let deliver = Deliverer::start()
        .map_err(|e| errors::error(format!("the settle runtime could not start: {e}")))?;
    let here = Here {
        pid,
        runtime: Box::leak(Box::new(runtime)),
        deliver,
    };
    // A parent's runtime in a child is forgotten, not dropped (see above).
    if let Some(old) = current.replace(here.clone()) {
        std::mem::forget(old);
    }
    Ok(here)
}

/// The process an object was made in.
#[derive(Clone)]
pub(crate) struct Owner {
    here: Here,
}

impl Owner {
    /// The current process, as the owner of what is made now.
    pub fn now() -> PyResult<Owner> {
        Ok(Owner { here: here()? })
    }

    /// This process's runtime, if the object was made in it; a
    /// `settle.Error` in a forked child.
    pub fn check(&self) -> PyResult<&Here> {
        let pid = std::process::id();
        if self.here.pid == pid {
            Ok(&self.here)
        } else {
            Err(errors::error(format!(
                "this settle object belongs to process {}, and this is process {pid} (a fork): \
                 its kernel's threads do not exist here; open a new kernel in this process",
                self.here.pid
            )))
        }
    }

    /// Whether this is the process the object was made in.
    pub fn is_here(&self) -> bool {
        self.here.pid == std::process::id()
    }
}

/// A value that must not be dropped outside its process (a kernel, a session
/// handle, a turn: their drops talk to threads a forked child does not have):
/// in another process it is forgotten instead.
pub(crate) struct ForkSafe<T> {
    value: Option<T>,
    owner: Owner,
}

impl<T> ForkSafe<T> {
    pub fn new(value: T, owner: Owner) -> Self {
        ForkSafe {
            value: Some(value),
            owner,
        }
    }

    /// The value and the runtime, in its own process only.
    pub fn get(&self) -> PyResult<(&T, &Here)> {
        let here = self.owner.check()?;
        match self.value.as_ref() {
            Some(value) => Ok((value, here)),
            None => Err(errors::error("this settle object was released")),
        }
    }
}

impl<T> Drop for ForkSafe<T> {
    fn drop(&mut self) {
        if !self.owner.is_here() {
            std::mem::forget(self.value.take());
        }
    }
}
