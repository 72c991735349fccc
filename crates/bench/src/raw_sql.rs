//! What the raw baselines write with: multi-row statements that stay
//! prepared, and the store's checkpoint policy on a connection of their own.
//!
//! Diesel does not keep a slice insert (`insert_into(t).values(&vec)`)
//! prepared: its text depends on the slice's length, so Diesel marks it unsafe
//! to cache and SQLite parses it again in every transaction. The store keeps
//! its multi-row statements prepared (`crates/store/src/rows.rs`); a raw
//! baseline that re-parsed every batch would be slower than a competent one.
//! [`Values`] is the same idea, written for the bench: a statement of `n`
//! rows has one text, which Diesel prepares once per connection and reuses.
//!
//! The store's writer connection never checkpoints inside a commit
//! (`wal_autocheckpoint = 0`); a thread of its own runs a passive checkpoint
//! every 100 ms (`crates/store/src/checkpoint.rs`). [`Checkpointer`] does the
//! same for a raw connection, so neither side pays for checkpoints inside its
//! timed commits and both keep the WAL from growing without bound.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::Duration;

use diesel::backend::Backend;
use diesel::connection::SimpleConnection;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::sqlite::SqliteConnection;
use diesel::{Connection, RunQueryDsl};

use crate::Result;

/// The store's pragmas for a raw SQLite connection (`crates/store/src/pool.rs`
/// and `open.rs`): WAL, `synchronous = NORMAL`, foreign keys, and no
/// checkpoint inside a commit.
pub const SQLITE_PRAGMAS: [&str; 5] = [
    "PRAGMA busy_timeout = 5000",
    "PRAGMA journal_mode = WAL",
    "PRAGMA synchronous = NORMAL",
    "PRAGMA foreign_keys = ON",
    "PRAGMA wal_autocheckpoint = 0",
];

/// A raw SQLite connection to `path` with [`SQLITE_PRAGMAS`].
pub fn sqlite(path: &str) -> Result<SqliteConnection> {
    let mut conn = SqliteConnection::establish(path)?;
    for pragma in SQLITE_PRAGMAS {
        conn.batch_execute(pragma)?;
    }
    Ok(conn)
}

/// How often the store's checkpoint thread runs (its `EVERY`).
const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Passive checkpoints of an SQLite file every 100 ms on a thread of their
/// own, as the store runs them; stopped and joined on drop.
pub struct Checkpointer {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    /// Starts checkpointing the database at `path`.
    pub fn spawn(path: &str) -> Result<Checkpointer> {
        let mut conn = SqliteConnection::establish(path)?;
        conn.batch_execute("PRAGMA busy_timeout = 5000")?;
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("bench-raw-checkpoint".to_owned())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(CHECKPOINT_EVERY) {
                    // A busy database only means the next one does more.
                    let _ = conn.batch_execute("PRAGMA wal_checkpoint(PASSIVE)");
                }
            })?;
        Ok(Checkpointer {
            stop: Some(stop),
            thread: Some(thread),
        })
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A row of bind parameters.
pub trait Row<DB: Backend> {
    /// Push this row's parameters, comma-separated, in column order.
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>;
}

/// `head (…), (…), …`: one statement inserting `rows`, one parenthesised
/// group of parameters per row. Its text depends only on `head` and the
/// number of rows, so Diesel keeps it prepared per connection.
pub struct Values<'a, R> {
    head: &'static str,
    rows: &'a [R],
}

impl<'a, R> Values<'a, R> {
    /// `INSERT INTO table (columns) VALUES ` followed by `rows`.
    pub fn insert(head: &'static str, rows: &'a [R]) -> Self {
        Values { head, rows }
    }
}

impl<DB: Backend, R: Row<DB>> QueryFragment<DB> for Values<'_, R> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.push_sql(self.head);
        for (k, row) in self.rows.iter().enumerate() {
            out.push_sql(if k == 0 { "(" } else { ", (" });
            row.push(&mut out)?;
            out.push_sql(")");
        }
        Ok(())
    }
}

impl<R> QueryId for Values<'_, R> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<R, Conn> RunQueryDsl<Conn> for Values<'_, R> {}
