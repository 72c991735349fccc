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
//! its limit the log is started over: a `RESTART` checkpoint (the passive
//! ones have already folded most of the log back, so it has little left to
//! copy) makes the writer's next commit write from the log's start, and
//! the writer's `journal_size_limit` cuts the file back to the limit then.
//! Not to nothing (a `TRUNCATE` checkpoint, as first written): SQLite
//! overwrites a log faster than it appends to one, and a log emptied every
//! few thousand commits made every frame after it an append (single-row
//! appends ran 35 % slower). It waits for about one commit at most, since
//! the writer waits while it does, and a restart a reader keeps from being
//! made is tried again after a wait that doubles, or as soon as the log
//! has grown by its limit again.

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

/// How long a restart waits for the writer's commit or a reader (and
/// holds up the writer meanwhile) before it gives up, to be tried again.
const RESTART_PATIENCE: Duration = Duration::from_millis(10);

/// The most looks between two tries of a restart that keeps failing (5 s).
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
            // Then it hardly waits: a restart that waits (for a reader
            // holding the log, for the writer's commit) holds the writer's
            // lock meanwhile, and every commit with it. It waits for about
            // one commit, and gives up past that, to be tried again later.
            if let Err(e) = conn.batch_execute(&format!(
                "PRAGMA busy_timeout = {}",
                RESTART_PATIENCE.as_millis()
            )) {
                tracing::warn!(error = %e, "configuring the checkpoint connection failed");
            }
            // The log's size is looked at ten times as often as it is
            // folded back (a file's size is one system call), so that it
            // passes its limit by at most what 10 ms of commits write.
            let mut tick = 0_u32;
            let mut schedule = Restarts::new(wal_limit);
            while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(LOOK) {
                tick = tick.wrapping_add(1);
                if tick % FOLD_EVERY == 0 {
                    if let Err(e) = conn.batch_execute("PRAGMA wal_checkpoint(PASSIVE)") {
                        tracing::debug!(error = %e, "a passive checkpoint failed; retrying later");
                    }
                }
                let size = std::fs::metadata(&wal).map_or(0, |m| m.len());
                if size <= wal_limit || !schedule.due(tick, size) {
                    continue;
                }
                // Folded back first without holding up the writer, so that
                // the restart, which does, has little left to fold.
                let _ = conn.batch_execute("PRAGMA wal_checkpoint(PASSIVE)");
                let restarted = match diesel::sql_query("PRAGMA wal_checkpoint(RESTART)")
                    .get_result::<Checkpointed>(&mut conn)
                {
                    Ok(c) if c.busy == 0 => true,
                    Ok(c) => {
                        tracing::debug!(
                            size,
                            frames = c.log,
                            folded = c.checkpointed,
                            "the WAL is over its limit and could not be started over yet (a reader holds it); retrying"
                        );
                        false
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, size, "starting the WAL over failed; retrying");
                        false
                    }
                };
                match restarted {
                    true => schedule.made(size),
                    false => schedule.failed(tick, size),
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

/// When a restart of a log past its limit is tried again after one could
/// not be made: after a wait that doubles while it keeps failing (a reader
/// that holds the log for long costs the writer a few short waits, not one
/// per look), back to every look once one is made; and at once when the
/// log has grown by its limit since the last failure, whatever the wait: a
/// long reader costs one short wait a limit's growth, and a restart kept
/// from being made by a moment's contention (the writer's commit, a reader
/// descheduled on a busy machine) lets the log grow by a limit, not for the
/// seconds of a wait that kept doubling, nor to twice its size each time
/// (two such moments in a row on a loaded machine took a 1 MiB log past
/// 4 MiB). A log restarted keeps its size until the
/// writer's next commit cuts it back: it is not restarted again before its
/// size changed.
#[derive(Debug)]
struct Restarts {
    /// The look from which the wait is over.
    from: u32,
    /// The next wait, in looks.
    backoff: u32,
    /// The log's size past which it is tried at once.
    past: u64,
    /// The log's size when it was last restarted.
    restarted: Option<u64>,
    /// The log's limit: how much it may grow between two tries.
    limit: u64,
}

impl Restarts {
    /// The schedule of a log whose limit is `limit` bytes.
    fn new(limit: u64) -> Self {
        Restarts {
            from: 0,
            backoff: 1,
            past: 0,
            restarted: None,
            limit,
        }
    }

    /// Whether a log of `size` bytes, past its limit, is tried at look `tick`.
    fn due(&self, tick: u32, size: u64) -> bool {
        self.restarted != Some(size) && (tick >= self.from || size > self.past)
    }

    /// A restart tried at look `tick` of a log of `size` bytes failed.
    fn failed(&mut self, tick: u32, size: u64) {
        self.from = tick.wrapping_add(self.backoff);
        self.backoff = self.backoff.saturating_mul(2).min(MAX_BACKOFF);
        self.past = size.saturating_add(self.limit);
        self.restarted = None;
    }

    /// A restart of a log of `size` bytes was made.
    fn made(&mut self, size: u64) {
        self.backoff = 1;
        self.restarted = Some(size);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restart_that_keeps_failing_waits_longer_each_time_until_the_log_grows_by_its_limit() {
        let mut schedule = Restarts::new(1_000);
        assert!(schedule.due(0, 1_000));
        // Failures at a steady size: each wait twice the one before.
        let mut tick = 0;
        for wait in [1, 2, 4, 8, 16] {
            schedule.failed(tick, 1_000);
            assert!(!schedule.due(tick + wait - 1, 1_000), "wait {wait}");
            assert!(schedule.due(tick + wait, 1_000), "wait {wait}");
            tick += wait;
        }
        // Within the wait, a log grown by its limit since the failure is
        // tried at once; one grown less is not.
        schedule.failed(tick, 1_000);
        assert!(!schedule.due(tick + 1, 2_000));
        assert!(schedule.due(tick + 1, 2_001));
        // By its limit, not to twice its size: a log that failed at three
        // times its limit is tried again past four.
        schedule.failed(tick, 3_000);
        assert!(schedule.due(tick + 1, 4_001));
        // The wait is capped, and starts over once a restart is made.
        for _ in 0..20 {
            schedule.failed(tick, 1_000);
        }
        assert!(schedule.due(tick + MAX_BACKOFF, 1_000));
        schedule.made(1_000);
        schedule.failed(tick, 1_000);
        assert!(schedule.due(tick + 1, 1_000));
    }

    /// A log restarted keeps its size until the next commit cuts it back:
    /// an idle store is not restarted every look.
    #[test]
    fn a_restarted_log_is_not_restarted_again_before_its_size_changes() {
        let mut schedule = Restarts::new(1_000);
        schedule.made(5_000);
        assert!(!schedule.due(1, 5_000));
        assert!(!schedule.due(100, 5_000));
        assert!(schedule.due(101, 5_001));
        assert!(schedule.due(101, 4_999));
    }
}
