//! The store's own threads (the writer, the checkpointer): a dropped store
//! waits for them only so long.
//!
//! A thread whose database stopped answering (a PostgreSQL server stopped
//! with SIGSTOP, whose kernel still acknowledges TCP; an SQLite file another
//! process keeps locked) may stay blocked in a call for a long time. Dropping
//! the store must not make the process's exit wait for it (G9): past the
//! bound the thread is left to finish or die with the process.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::thread::JoinHandle;
use std::time::Duration;

/// A named thread that says when it has ended.
pub(crate) struct StoreThread {
    name: &'static str,
    handle: Option<JoinHandle<()>>,
    // In a mutex only so that a store can be shared between threads; it is
    // used once, through `&mut self`.
    ended: Mutex<Receiver<()>>,
}

impl StoreThread {
    /// Run `work` on a new thread named `name`.
    pub(crate) fn spawn(
        name: &'static str,
        work: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<StoreThread> {
        let (ending, ended) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                // Dropped when `work` returns or unwinds: either way it ended.
                let _ending = ending;
                work();
            })?;
        Ok(StoreThread {
            name,
            handle: Some(handle),
            ended: Mutex::new(ended),
        })
    }

    /// Wait up to `bound` for the thread to end (it must have been told to);
    /// past that, leave it running and log it.
    pub(crate) fn finish_within(&mut self, bound: Duration) {
        let Some(handle) = self.handle.take() else {
            return;
        };
        let ended = self
            .ended
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match ended.recv_timeout(bound) {
            Err(RecvTimeoutError::Timeout) => tracing::warn!(
                thread = self.name,
                ?bound,
                "a store thread did not finish in time (its database is not answering); \
                 leaving it behind, and what it had not committed to recovery"
            ),
            Ok(()) | Err(RecvTimeoutError::Disconnected) => {
                if handle.join().is_err() {
                    tracing::error!(thread = self.name, "a store thread panicked");
                }
            }
        }
    }
}
