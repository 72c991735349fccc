//! The pooled read connections, and the SQLite settings every connection gets.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::r2d2::{ConnectionManager, CustomizeConnection, Pool};
use diesel::sqlite::SqliteConnection;

use crate::conn::Db;
use crate::durability::Durability;
use crate::error::{DbError, StoreError};

/// The SQLite settings, in this order and each its own statement: the busy
/// timeout first (so the others wait for a lock instead of failing), then WAL,
/// the `synchronous` setting of `durability` ([`Durability`]), foreign keys.
pub(crate) fn sqlite_pragmas(busy_timeout: Duration, durability: Durability) -> [String; 4] {
    [
        format!("PRAGMA busy_timeout = {}", busy_timeout.as_millis()),
        "PRAGMA journal_mode = WAL".to_owned(),
        durability.pragma().to_owned(),
        "PRAGMA foreign_keys = ON".to_owned(),
    ]
}

/// Applies [`sqlite_pragmas`] to every pooled connection.
#[derive(Debug)]
pub(crate) struct SqliteSettings {
    pub(crate) busy_timeout: Duration,
    pub(crate) durability: Durability,
    /// A store opened to read only: the busy timeout alone (the others
    /// would switch or write the file).
    pub(crate) read_only: bool,
}

impl CustomizeConnection<SqliteConnection, diesel::r2d2::Error> for SqliteSettings {
    fn on_acquire(&self, conn: &mut SqliteConnection) -> Result<(), diesel::r2d2::Error> {
        let pragmas = sqlite_pragmas(self.busy_timeout, self.durability);
        let take = if self.read_only { 1 } else { pragmas.len() };
        for statement in pragmas.iter().take(take) {
            conn.batch_execute(statement)
                .map_err(diesel::r2d2::Error::QueryError)?;
        }
        Ok(())
    }
}

/// The connection timeout a pool is built with. r2d2 uses it for two
/// things: how long `get` waits (the store asks for its own wait, the
/// `connection_timeout` option, with `get_timeout`), and the cap of the
/// growing wait between its tries to open a connection again once the
/// server is gone: half of it. With the default 30 s, a PostgreSQL
/// restarted for 6 s was tried again only 12 s after it went, past the
/// store timeout, so every turn waiting on a read failed; with this the
/// pool tries at least once a second, as the store's other retries do.
pub(crate) const POOL_CONNECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// A pool of read connections of either backend, and how long a read waits
/// for one.
#[derive(Clone)]
pub(crate) struct ReadPool {
    conns: Conns,
    wait: Duration,
}

#[derive(Clone)]
enum Conns {
    Sqlite(Pool<ConnectionManager<SqliteConnection>>),
    Pg(Pool<ConnectionManager<PgConnection>>),
}

impl ReadPool {
    /// SQLite's read connections; a read waits up to `wait` for one.
    pub(crate) fn sqlite(pool: Pool<ConnectionManager<SqliteConnection>>, wait: Duration) -> Self {
        ReadPool {
            conns: Conns::Sqlite(pool),
            wait,
        }
    }

    /// PostgreSQL's read connections; a read waits up to `wait` for one.
    pub(crate) fn pg(pool: Pool<ConnectionManager<PgConnection>>, wait: Duration) -> Self {
        ReadPool {
            conns: Conns::Pg(pool),
            wait,
        }
    }

    /// Run `f` on a pooled connection (blocking).
    pub(crate) fn with<T>(
        &self,
        f: impl FnOnce(Db<'_>) -> Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let refused = |e| StoreError::Connection {
            source: DbError::new(e),
        };
        match &self.conns {
            Conns::Sqlite(p) => {
                let mut c = p.get_timeout(self.wait).map_err(refused)?;
                f(Db::Sqlite(&mut c))
            }
            Conns::Pg(p) => {
                let mut c = p.get_timeout(self.wait).map_err(refused)?;
                f(Db::Pg(&mut c))
            }
        }
    }
}

/// How a pool says it could not open a connection: on one line, at debug
/// level. r2d2's own handler logs each failed attempt as an error, with
/// libpq's message over several lines, dozens of times through one
/// PostgreSQL restart the store rides out; a call that needed the
/// connection and did not get it is told, and says so itself.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QuietErrors;

impl<E: std::fmt::Display> diesel::r2d2::HandleError<E> for QuietErrors {
    fn handle_error(&self, error: E) {
        let line = error
            .to_string()
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        tracing::debug!(error = %line, "a store connection could not be opened; the pool tries again");
    }
}

#[cfg(test)]
mod tests {
    use diesel::prelude::*;
    use diesel::sql_types::BigInt;

    use super::*;

    #[derive(QueryableByName)]
    struct Synchronous {
        #[diesel(sql_type = BigInt)]
        synchronous: i64,
    }

    /// The `synchronous` setting a connection is left with by the pragmas.
    fn synchronous_after(durability: Durability) -> i64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.db");
        let mut conn = SqliteConnection::establish(path.to_str().unwrap()).unwrap();
        for pragma in sqlite_pragmas(Duration::from_secs(1), durability) {
            conn.batch_execute(&pragma).unwrap();
        }
        diesel::sql_query("PRAGMA synchronous")
            .get_result::<Synchronous>(&mut conn)
            .unwrap()
            .synchronous
    }

    #[test]
    fn each_durability_sets_its_own_synchronous_mode() {
        // SQLite's numbering: 1 NORMAL, 2 FULL.
        assert_eq!(synchronous_after(Durability::Normal), 1);
        assert_eq!(synchronous_after(Durability::Full), 2);
        assert_eq!(Durability::default(), Durability::Normal);
    }
}
