//! WAL checkpoints off the writer's path (SQLite only).
//!
//! SQLite normally checkpoints on the connection whose commit grew the WAL past
//! its threshold, inside that commit: the writer thread would then copy pages
//! and sync the database file before it could acknowledge the chunks it just
//! committed. The writer's connection has automatic checkpoints turned off;
//! this thread runs passive checkpoints (which never block the writer) on its
//! own connection instead.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::sqlite::SqliteConnection;
use diesel::Connection;

use crate::durability::Durability;
use crate::pool::sqlite_pragmas;
use crate::thread::StoreThread;

/// How often the WAL is folded back into the database.
const EVERY: Duration = Duration::from_millis(100);

/// The checkpoint thread; dropping it stops the thread and waits for it up to
/// the close timeout.
pub(crate) struct Checkpointer {
    stop: Option<Sender<()>>,
    thread: StoreThread,
    close_timeout: Duration,
}

impl Checkpointer {
    pub(crate) fn spawn(
        path: &str,
        busy_timeout: Duration,
        durability: Durability,
        close_timeout: Duration,
    ) -> std::io::Result<Checkpointer> {
        let path = path.to_owned();
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = StoreThread::spawn("settle-store-checkpoint", move || {
            let mut conn = match SqliteConnection::establish(&path) {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "no checkpoint connection; the WAL is checkpointed when the store closes");
                    return;
                }
            };
            for pragma in sqlite_pragmas(busy_timeout, durability) {
                if let Err(e) = conn.batch_execute(&pragma) {
                    tracing::warn!(error = %e, "configuring the checkpoint connection failed");
                }
            }
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(EVERY) {
                if let Err(e) = conn.batch_execute("PRAGMA wal_checkpoint(PASSIVE)") {
                    tracing::debug!(error = %e, "a passive checkpoint failed; retrying later");
                }
            }
        })?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread,
            close_timeout,
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        self.thread.finish_within(self.close_timeout);
    }
}
