//! The writer thread: every write of a [`Store`](crate::Store) runs here, on
//! one dedicated connection, in the order it was submitted, so Diesel never
//! blocks an async worker and a chunk appended before `end_turn` is committed
//! before it.
//!
//! Chunk appends are group-committed: the writer takes every chunk already
//! waiting (up to the batch size, for at most the flush interval) and commits
//! them in one transaction, then answers each. Any other command is a
//! transaction of its own and closes the batch before it.

use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use diesel::pg::PgConnection;
use diesel::r2d2::R2D2Connection;
use diesel::Connection;
use settle_core::SessionId;
use tokio::sync::oneshot;

use crate::chunk::{commit_batch, ChunkReceipt, NewChunk, PendingChunk};
use crate::conn::{AnyConn, Db};
use crate::error::StoreError;
use crate::thread::StoreThread;
use crate::wal_backstop::WalBackstop;

/// A write; returns whether it failed in the database (not a refusal).
type Op = Box<dyn FnOnce(Db<'_>) -> bool + Send>;

enum Command {
    Chunk(PendingChunk),
    Op(Op),
}

/// The handle to the writer thread. Dropping it lets the thread finish what
/// was queued, close its connection and exit, and waits for that up to the
/// close timeout (see [`StoreThread`]).
pub(crate) struct Writer {
    tx: Option<Sender<Command>>,
    thread: StoreThread,
    close_timeout: Duration,
}

impl Writer {
    /// Start the writer on `conn`. With `reconnect` (a PostgreSQL URL), a
    /// connection found dead after a failed write is established again.
    pub(crate) fn spawn(
        conn: AnyConn,
        batch_size: usize,
        flush_interval: Duration,
        close_timeout: Duration,
        reconnect: Option<String>,
        wal: Option<WalBackstop>,
    ) -> std::io::Result<Writer> {
        let (tx, rx) = mpsc::channel();
        let thread = StoreThread::spawn("settle-store-writer", move || {
            run(
                conn,
                rx,
                batch_size.max(1),
                flush_interval,
                reconnect.as_deref(),
                wal,
            )
        })?;
        Ok(Writer {
            tx: Some(tx),
            thread,
            close_timeout,
        })
    }

    /// Queue a chunk now; the receipt resolves after its commit.
    pub(crate) fn append(&self, session: SessionId, turn: u32, chunk: NewChunk) -> ChunkReceipt {
        let (ack, rx) = oneshot::channel();
        let chunk = PendingChunk {
            session,
            turn,
            chunk,
            ack,
        };
        match &self.tx {
            Some(tx) if tx.send(Command::Chunk(chunk)).is_ok() => ChunkReceipt::pending(rx),
            _ => ChunkReceipt::ready(Err(StoreError::Unavailable)),
        }
    }

    /// Queue `f` to run on the writer's connection after everything queued
    /// before it, nobody waiting for it: what it fails with is logged.
    pub(crate) fn queue<F>(&self, what: &'static str, f: F)
    where
        F: FnOnce(Db<'_>) -> Result<(), StoreError> + Send + 'static,
    {
        let op: Op = Box::new(move |db| match f(db) {
            Ok(()) => false,
            Err(error) => {
                tracing::warn!(%error, "could not {what}");
                matches!(
                    error,
                    StoreError::Database { .. } | StoreError::Connection { .. }
                )
            }
        });
        if let Some(tx) = &self.tx {
            let _ = tx.send(Command::Op(op));
        }
    }

    /// Run `f` on the writer's connection after everything queued before it.
    pub(crate) async fn call<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        T: Send + 'static,
        F: FnOnce(Db<'_>) -> Result<T, StoreError> + Send + 'static,
    {
        let (reply, rx) = oneshot::channel();
        let op: Op = Box::new(move |db| {
            let result = f(db);
            let failed = matches!(
                result,
                Err(StoreError::Database { .. } | StoreError::Connection { .. })
            );
            // Nobody waiting for the answer is not an error.
            let _ = reply.send(result);
            failed
        });
        let tx = self.tx.as_ref().ok_or(StoreError::Unavailable)?;
        tx.send(Command::Op(op))
            .map_err(|_| StoreError::Unavailable)?;
        rx.await.map_err(|_| StoreError::Unavailable)?
    }
}

impl Writer {
    /// Closing does not wait for the thread (see
    /// [`SessionStore::shutdown_gave_up`](crate::SessionStore::shutdown_gave_up)).
    pub(crate) fn leave_behind(&mut self) {
        self.close_timeout = Duration::ZERO;
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        drop(self.tx.take());
        self.thread.finish_within(self.close_timeout);
    }
}

fn run(
    mut conn: AnyConn,
    rx: Receiver<Command>,
    batch_size: usize,
    flush_interval: Duration,
    reconnect: Option<&str>,
    mut wal: Option<WalBackstop>,
) {
    let mut next: Option<Command> = None;
    // The connection was lost and could not be established again yet: try
    // again before the next write instead of spending that write on it.
    let mut lost = false;
    let mut outage = Outage::default();
    loop {
        let command = match next.take() {
            Some(c) => c,
            None => match rx.recv() {
                Ok(c) => c,
                Err(_) => {
                    outage.say_still_lost();
                    return;
                }
            },
        };
        // Tried before this write: not again right after it fails.
        let tried = lost;
        if lost {
            lost = !repair(&mut conn, reconnect, &mut outage);
        }
        let failed = match command {
            Command::Op(op) => op(conn.db()),
            Command::Chunk(first) => {
                let opened = Instant::now();
                let mut batch = vec![first];
                while batch.len() < batch_size && opened.elapsed() < flush_interval {
                    match rx.try_recv() {
                        Ok(Command::Chunk(c)) => batch.push(c),
                        Ok(other) => {
                            next = Some(other);
                            break;
                        }
                        Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
                    }
                }
                commit_batch(conn.db(), batch)
            }
        };
        if failed && !tried {
            lost = !repair(&mut conn, reconnect, &mut outage);
        } else if failed {
            lost = true;
        } else if let Some(wal) = wal.as_mut() {
            wal.after_commit(&mut conn);
        }
    }
}

/// After a failed write (and before the next one while it stays lost), check
/// that a PostgreSQL connection is still alive and establish it again if not,
/// so that a server restart costs the writes in flight, not later ones.
/// Returns whether the connection is usable. (A failed write is not retried:
/// whether a commit interrupted by a lost connection took effect is unknown.)
fn repair(conn: &mut AnyConn, reconnect: Option<&str>, outage: &mut Outage) -> bool {
    let (AnyConn::Pg(c), Some(url)) = (conn, reconnect) else {
        return true;
    };
    if c.ping().is_ok() {
        return true;
    }
    match PgConnection::establish(url) {
        Ok(fresh) => {
            *c = fresh;
            let (tries, lost_for, said) = outage.healed(Instant::now());
            // Said at the level its loss was, so that whoever read one
            // line reads the other (`serve` logs warnings only, by
            // default); a connection established again at the first try
            // had no outage line to end.
            if said {
                tracing::warn!(
                    tries,
                    ?lost_for,
                    "the store's writer connection was lost and is established again"
                );
            } else {
                tracing::info!(
                    tries,
                    ?lost_for,
                    "the store's writer connection was lost and is established again"
                );
            }
            true
        }
        Err(e) => {
            let error = why_lost(&e);
            if outage.failed(Instant::now()) {
                tracing::warn!(%error, "the store's writer connection is lost; will try again before each write (said again once it is back)");
            } else {
                tracing::debug!(%error, "the store's writer connection is still lost");
            }
            false
        }
    }
}

/// The writer's connection while it is lost: since when, and how many
/// tries to establish it again failed. An outage is said when it begins
/// and when it ends, not at each write it fails (a server down for 5 s
/// wrote 21 lines, and 162 in 8 s at a shutdown's retries).
#[derive(Debug, Default)]
struct Outage {
    since: Option<Instant>,
    tries: u32,
}

impl Outage {
    /// A try to establish the connection again failed at `now`: whether
    /// it is the outage's first (to be said).
    fn failed(&mut self, now: Instant) -> bool {
        self.tries = self.tries.saturating_add(1);
        self.since.get_or_insert(now);
        self.tries == 1
    }

    /// The connection is established again at `now`: how many tries it
    /// took (this one included), how long it was lost, and whether its loss
    /// was said (a try had failed before); the outage ends.
    fn healed(&mut self, now: Instant) -> (u32, Duration, bool) {
        let said = self.tries > 0;
        let tries = self.tries.saturating_add(1);
        let lost_for = self
            .since
            .map_or(Duration::ZERO, |since| now.saturating_duration_since(since));
        *self = Outage::default();
        (tries, lost_for, said)
    }

    /// As the writer stops: says an outage that has not ended.
    fn say_still_lost(&self) {
        if let Some(since) = self.since {
            tracing::warn!(
                tries = self.tries,
                lost_for = ?since.elapsed(),
                "the store's writer stopped with its connection still lost"
            );
        }
    }
}

/// Why the writer's connection could not be established again, on the one
/// log line that says it (libpq's message spans several).
fn why_lost(e: &diesel::ConnectionError) -> String {
    crate::error::one_line(&e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_is_said_once_when_it_begins_and_counted_when_it_ends() {
        let mut outage = Outage::default();
        let t0 = Instant::now();
        assert!(outage.failed(t0), "the first failed try is said");
        for i in 1..20 {
            assert!(!outage.failed(t0 + Duration::from_millis(250 * i)));
        }
        let (tries, lost_for, said) = outage.healed(t0 + Duration::from_secs(5));
        assert_eq!((tries, lost_for, said), (21, Duration::from_secs(5), true));
        assert!(
            outage.failed(t0 + Duration::from_secs(9)),
            "a new outage is said again"
        );
    }

    /// The line that ends an outage is a warning when the outage's start
    /// was one (`serve` logs warnings only, and showed the start alone).
    #[test]
    fn an_outage_whose_start_was_said_says_its_end_too() {
        let t0 = Instant::now();
        let mut at_once = Outage::default();
        assert!(
            !at_once.healed(t0).2,
            "back at the first try: nothing was said"
        );
        let mut said = Outage::default();
        assert!(said.failed(t0));
        assert!(said.healed(t0 + Duration::from_secs(1)).2);
    }

    #[test]
    fn a_lost_writer_connection_is_said_on_one_log_line() {
        // libpq's words for a server that is down, line breaks included.
        let refused = diesel::ConnectionError::BadConnection(
            "connection to server at \"127.0.0.1\", port 5432 failed: Connection refused\n\
             \tIs the server running on that host and accepting TCP/IP connections?\n"
                .to_owned(),
        );
        assert_eq!(
            why_lost(&refused),
            "connection to server at \"127.0.0.1\", port 5432 failed: Connection refused \
             Is the server running on that host and accepting TCP/IP connections?"
        );
    }
}
