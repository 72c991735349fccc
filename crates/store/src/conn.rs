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
/// lock the rows they test.
macro_rules! write_tx {
    ($db:expr, |$c:ident| $body:expr) => {
        match $db {
            $crate::conn::Db::Sqlite(c0) => c0.immediate_transaction(|$c| $body),
            $crate::conn::Db::Pg(c0) => c0.transaction(|$c| $body),
        }
    };
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
