//! One connection of either backend, and the macros that run one piece of
//! Diesel code on whichever it is.
//!
//! Diesel's query builder is typed by backend, so code that must run on both is
//! written once and expanded twice by [`on_db!`] / [`write_tx!`] / [`read_tx!`]:
//! each arm type-checks against its own connection type.

use diesel::pg::PgConnection;
use diesel::sqlite::SqliteConnection;

/// An owned connection of either backend (the writer thread's).
pub(crate) enum AnyConn {
    Sqlite(SqliteConnection),
    Pg(PgConnection),
}

impl AnyConn {
    pub(crate) fn db(&mut self) -> Db<'_> {
        match self {
            AnyConn::Sqlite(c) => Db::Sqlite(c),
            AnyConn::Pg(c) => Db::Pg(c),
        }
    }
}

/// A borrowed connection of either backend.
pub(crate) enum Db<'a> {
    Sqlite(&'a mut SqliteConnection),
    Pg(&'a mut PgConnection),
}

impl<'a> From<&'a mut SqliteConnection> for Db<'a> {
    fn from(c: &'a mut SqliteConnection) -> Self {
        Db::Sqlite(c)
    }
}

impl<'a> From<&'a mut PgConnection> for Db<'a> {
    fn from(c: &'a mut PgConnection) -> Self {
        Db::Pg(c)
    }
}

/// Run `$body` with `$c` bound to the concrete connection.
macro_rules! on_db {
    ($db:expr, |$c:ident| $body:expr) => {
        match $db {
            $crate::conn::Db::Sqlite($c) => $body,
            $crate::conn::Db::Pg($c) => $body,
        }
    };
}

/// Run `$body` in a write transaction: `BEGIN IMMEDIATE` on SQLite, so a
/// read-then-write cannot be overtaken by another writer between its read and
/// its write; a plain transaction on PostgreSQL, where the conditional updates
/// lock the rows they test. A body that fails fails with its own error, even
/// when the rollback after it fails too (see [`Cause`]).
macro_rules! write_tx {
    ($db:expr, |$c:ident| $body:expr) => {{
        let mut cause = $crate::conn::Cause::default();
        let ran = match $db {
            // The body in a closure of its own, so that its `?` is kept too.
            #[allow(clippy::redundant_closure_call)]
            $crate::conn::Db::Sqlite(c0) => c0.immediate_transaction(|$c| cause.keep((|| $body)())),
            #[allow(clippy::redundant_closure_call)]
            $crate::conn::Db::Pg(c0) => c0.transaction(|$c| cause.keep((|| $body)())),
        };
        cause.first(ran)
    }};
}

/// The error a transaction's body failed with, kept aside: Diesel answers a
/// body's failure with the rollback's when the rollback fails too, and
/// SQLite, which rolls the whole transaction back itself at some failures
/// (a full disk, `SQLITE_FULL`), then refuses the rollback that follows
/// ("cannot rollback - no transaction is active"), which said nothing of
/// the disk.
pub(crate) struct Cause<E>(Option<E>);

impl<E> Default for Cause<E> {
    fn default() -> Self {
        Cause(None)
    }
}

impl<E: From<diesel::result::Error>> Cause<E> {
    /// The body's result, its error kept here and Diesel given one of its
    /// own to roll back on.
    pub(crate) fn keep<T>(&mut self, body: Result<T, E>) -> Result<T, E> {
        body.map_err(|error| {
            self.0 = Some(error);
            E::from(diesel::result::Error::RollbackTransaction)
        })
    }

    /// The transaction's result, with the body's own error if it failed.
    pub(crate) fn first<T>(self, ran: Result<T, E>) -> Result<T, E> {
        match (ran, self.0) {
            (Ok(value), _) => Ok(value),
            (Err(_), Some(cause)) => Err(cause),
            (Err(error), None) => Err(error),
        }
    }
}

/// Run `$body` in a read-only transaction that sees one snapshot.
macro_rules! read_tx {
    ($db:expr, |$c:ident| $body:expr) => {
        match $db {
            $crate::conn::Db::Sqlite(c0) => c0.transaction(|$c| $body),
            $crate::conn::Db::Pg(c0) => c0
                .build_transaction()
                .read_only()
                .repeatable_read()
                .run(|$c| $body),
        }
    };
}

impl Db<'_> {
    /// A shorter borrow of the same connection, to pass on while keeping this one.
    pub(crate) fn reborrow(&mut self) -> Db<'_> {
        match self {
            Db::Sqlite(c) => Db::Sqlite(c),
            Db::Pg(c) => Db::Pg(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, RunQueryDsl};

    use super::*;
    use crate::error::StoreError;

    /// A database that fills (its page count capped, as a full disk does):
    /// SQLite rolls the whole transaction back at `SQLITE_FULL`, so the
    /// rollback that follows finds none and fails; the write says the
    /// disk is full, not that the rollback failed.
    #[test]
    fn a_write_on_a_full_database_fails_with_its_own_cause_not_the_rollbacks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.db");
        let mut conn = SqliteConnection::establish(path.to_str().unwrap()).unwrap();
        conn.batch_execute("PRAGMA journal_mode = WAL; CREATE TABLE t (b BLOB);")
            .unwrap();
        conn.batch_execute("PRAGMA max_page_count = 10;").unwrap();
        let written: Result<(), StoreError> = write_tx!(Db::Sqlite(&mut conn), |c| {
            diesel::sql_query("INSERT INTO t VALUES (1)").execute(c)?;
            diesel::sql_query("INSERT INTO t VALUES (randomblob(100000))").execute(c)?;
            Ok(())
        });
        let error = written.unwrap_err();
        let said = error.to_string();
        assert!(said.contains("database or disk is full"), "{said}");
        assert!(error.may_heal(), "{error:?}");
        // The connection goes on: once there is room, the next write lands.
        conn.batch_execute("PRAGMA max_page_count = 100000;")
            .unwrap();
        let written: Result<(), StoreError> = write_tx!(Db::Sqlite(&mut conn), |c| {
            diesel::sql_query("INSERT INTO t VALUES (2)").execute(c)?;
            Ok(())
        });
        assert!(written.is_ok(), "{written:?}");
    }
}
