//! The writer's own bound on SQLite's write-ahead log. The checkpoint
//! thread keeps the log near its limit (`checkpoint.rs`); on a machine whose
//! cores are busy that thread may not run for a while, and the writer,
//! committing thousands of times a second, took the log past four times its
//! limit meanwhile (4.3 MiB for 1 MiB, on two loaded cores). So the writer
//! looks at the log's size every [`EVERY`] commits and, past twice the
//! limit, folds it back itself with a passive checkpoint, which never waits
//! for a reader: the commit after it starts the log over, and the log's
//! size limit cuts the file back. Under a normal load the checkpoint thread
//! has done that long before.

use diesel::connection::SimpleConnection;

use crate::conn::AnyConn;

/// How many commits apart the log's size is looked at (a file's size is
/// one system call).
const EVERY: u32 = 32;

/// The log of one SQLite database, bounded from the writer.
pub(crate) struct WalBackstop {
    wal: String,
    limit: u64,
    commits: u32,
}

impl WalBackstop {
    /// The backstop of the database at `path`, whose log's limit is
    /// `limit` bytes.
    pub(crate) fn new(path: &str, limit: u64) -> Self {
        WalBackstop {
            wal: format!("{path}-wal"),
            limit,
            commits: 0,
        }
    }

    /// After a commit on the writer's `conn`: folds the log back when it
    /// is past twice its limit.
    pub(crate) fn after_commit(&mut self, conn: &mut AnyConn) {
        self.commits = self.commits.wrapping_add(1);
        if self.commits % EVERY != 0 {
            return;
        }
        let size = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        if size <= self.limit.saturating_mul(2) {
            return;
        }
        if let AnyConn::Sqlite(c) = conn {
            if let Err(error) = c.batch_execute("PRAGMA wal_checkpoint(PASSIVE)") {
                tracing::debug!(%error, size, "the writer could not fold the log back; the checkpoint thread will");
            }
        }
    }
}
