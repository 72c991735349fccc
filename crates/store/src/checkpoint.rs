//! WAL checkpoints off the writer's path (SQLite only).
//!
//! SQLite normally checkpoints on the connection whose commit grew the WAL past
//! its threshold, inside that commit: the writer thread would then copy pages
//! and sync the database file before it could acknowledge the chunks it just
//! committed. The writer's connection has automatic checkpoints turned off;
//! this thread runs passive checkpoints (which never block the writer) on its
//! own connection instead.
//!
//! A passive checkpoint folds every committed page back, but the log is only
//! started over when a commit begins right after one has caught up, and
//! under a steady stream of commits that moment never comes: the log grew to
//! a hundred times the database (118 MiB for 1 MiB in 12 s outside) and kept
//! that size, filling a small disk again as soon as space was freed. Past
//! its limit the log is truncated: a `TRUNCATE` checkpoint (the passive
//! ones have already folded most of the log back, so it has little left to
//! copy). It waits for about one commit at most, since the writer waits
//! while it does, and a truncation a reader keeps from being made is tried
//! again after a wait that doubles.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, RunQueryDsl};

use crate::durability::Durability;
use crate::pool::sqlite_pragmas;
use crate::thread::StoreThread;

/// What a checkpoint says: whether it was kept from finishing, the frames
/// in the log, and those folded back.
#[derive(diesel::QueryableByName)]
struct Checkpointed {
    #[diesel(sql_type = diesel::sql_types::Integer)]
    busy: i32,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    log: i32,
    #[diesel(sql_type = diesel::sql_types::Integer)]
    checkpointed: i32,
}

/// How often the WAL's size is looked at.
const LOOK: Duration = Duration::from_millis(10);

/// Every how many looks it is folded back into the database (100 ms).
const FOLD_EVERY: u32 = 10;

/// How long a truncation waits for the writer's commit or a reader (and
/// holds up the writer meanwhile) before it gives up, to be tried again.
const TRUNCATE_PATIENCE: Duration = Duration::from_millis(10);

/// The most looks between two tries of a truncation that keeps failing
/// (5 s).
const MAX_BACKOFF: u32 = 500;

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
        wal_limit: u64,
    ) -> std::io::Result<Checkpointer> {
        let path = path.to_owned();
        let wal = format!("{path}-wal");
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
            // Then it hardly waits: a truncation that waits (for a reader
            // holding the log, for the writer's commit) holds the writer's
            // lock meanwhile, and every commit with it. It waits for about
            // one commit, and gives up past that, to be tried again later.
            if let Err(e) = conn.batch_execute(&format!(
                "PRAGMA busy_timeout = {}",
                TRUNCATE_PATIENCE.as_millis()
            )) {
                tracing::warn!(error = %e, "configuring the checkpoint connection failed");
            }
            // The log's size is looked at ten times as often as it is
            // folded back (a file's size is one system call), so that it
            // passes its limit by at most what 10 ms of commits write.
            let mut tick = 0_u32;
            // A truncation that could not be made is tried again later, the
            // wait doubling while it keeps failing (a reader that holds the
            // log for long costs the writer a few short waits, not one per
            // look), back to every look once one is made.
            let mut truncate_from = 0_u32;
            let mut backoff = 1_u32;
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(LOOK) {
                tick = tick.wrapping_add(1);
                if tick % FOLD_EVERY == 0 {
                    if let Err(e) = conn.batch_execute("PRAGMA wal_checkpoint(PASSIVE)") {
                        tracing::debug!(error = %e, "a passive checkpoint failed; retrying later");
                    }
                }
                let size = std::fs::metadata(&wal).map_or(0, |m| m.len());
                if size <= wal_limit || tick < truncate_from {
                    continue;
                }
                let truncated = match diesel::sql_query("PRAGMA wal_checkpoint(TRUNCATE)")
                    .get_result::<Checkpointed>(&mut conn)
                {
                    Ok(c) if c.busy == 0 => true,
                    Ok(c) => {
                        tracing::debug!(
                            size,
                            frames = c.log,
                            folded = c.checkpointed,
                            "the WAL is over its limit and could not be truncated yet (a reader holds it); retrying"
                        );
                        false
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, size, "truncating the WAL failed; retrying");
                        false
                    }
                };
                match truncated {
                    true => backoff = 1,
                    false => {
                        truncate_from = tick.wrapping_add(backoff);
                        backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
                    }
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

impl Checkpointer {
    /// Closing does not wait for the thread (see
    /// [`SessionStore::shutdown_gave_up`](crate::SessionStore::shutdown_gave_up)).
    pub(crate) fn leave_behind(&mut self) {
        self.close_timeout = Duration::ZERO;
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        self.thread.finish_within(self.close_timeout);
    }
}
