//! The two error types: [`OpenError`] (the database could not be opened; nothing
//! was written) and [`StoreError`] (an operation on an open store failed).
//!
//! Every message is a sentence that names what failed and says what to do.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use settle_core::{EndReason, SessionId, State};

use crate::lease::OwnerId;

/// Why [`Store::open`](crate::Store::open) refused a database location.
///
/// Each variant is a distinct, user-correctable condition. When `open` returns
/// one of these it has written nothing: no file was created, and an existing
/// file was not modified.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The location is not a file path the store can use: an in-memory
    /// database (`:memory:`, which the store's connections could not
    /// share and which would keep nothing) or an SQLite `file:` URI.
    #[error("{}: {reason}; pass the path of a database file", path.display())]
    NotAPath {
        /// The location asked for.
        path: PathBuf,
        /// Why it is not one.
        reason: &'static str,
    },
    /// The location is libpq's keyword string (`host=… dbname=…`), which
    /// the store does not take; it is not repeated in the message, as it
    /// may hold a password.
    #[error(
        "the database location is a libpq keyword string (host=… dbname=…), which is not taken (and not repeated here: it may hold a password); pass it as a postgres:// URL"
    )]
    ConnString,
    /// The path is a symbolic link to nothing: the store neither creates
    /// its target nor removes the link.
    #[error(
        "the database path {} is a symbolic link to {}, which does not exist; create the target or pass another path",
        path.display(), target.display()
    )]
    DanglingLink {
        /// The link.
        path: PathBuf,
        /// Where it points.
        target: PathBuf,
    },
    /// The folder that should hold a new SQLite database does not exist.
    #[error(
        "cannot create the database {}: its folder {} does not exist; create the folder or choose another path",
        path.display(), folder.display()
    )]
    MissingFolder {
        /// The database path asked for.
        path: PathBuf,
        /// The folder that is missing (or is not a folder).
        folder: PathBuf,
    },
    /// Opened to read only where SQLite may not make the write-ahead log's
    /// index (a read-only mount, a folder this user may not write), the
    /// database has its log beside it (`-wal`) but not the index (`-shm`):
    /// what the log holds cannot be read, and the file alone is not every
    /// commit.
    #[error(
        "the database {} has its write-ahead log ({}-wal) beside it but not the log's index (-shm), which cannot be made here; copy the -shm file with it, or fold the log in first where the file can be written (sqlite3 FILE 'PRAGMA wal_checkpoint(TRUNCATE)')",
        path.display(), path.display()
    )]
    LogWithoutIndex {
        /// The path asked for.
        path: PathBuf,
    },
    /// The location cannot be written (permissions or a read-only file system).
    #[error(
        "cannot open the database {} for writing: {reason}; choose a writable location or fix its permissions",
        path.display()
    )]
    ReadOnly {
        /// The database path asked for.
        path: PathBuf,
        /// What refused the write, as the operating system said it.
        reason: String,
    },
    /// The database file is there but this user may not read it (a file
    /// the store made for another user is its owner's only).
    #[error(
        "cannot read the database {}: {reason}; run as a user who may read it, or fix its permissions",
        path.display()
    )]
    Unreadable {
        /// The database path asked for.
        path: PathBuf,
        /// What refused the read, as the operating system said it.
        reason: String,
    },
    /// The path names a directory, not a database file.
    #[error(
        "{} is a directory, not a database file; pass a file path such as {}",
        path.display(), path.join("settle.db").display()
    )]
    IsDirectory {
        /// The path asked for.
        path: PathBuf,
    },
    /// The file exists but is not an SQLite database; it was left untouched.
    #[error(
        "{} is not an SQLite database (its header is wrong); it was left untouched; pass the path of a settle database or of a new file",
        path.display()
    )]
    NotADatabase {
        /// The path asked for.
        path: PathBuf,
    },
    /// The file or database holds no settle database yet (an empty file,
    /// an SQLite database without tables, a PostgreSQL database without the
    /// store's tables), and the store was opened for an existing one only
    /// ([`StoreOptions::existing_only`](crate::StoreOptions::existing_only)); it was left untouched.
    #[error(
        "{} holds no settle database (none of settle's tables are in it); it was left untouched; `settle run` or `settle chat` makes one, or pass --db with one that has",
        path.display()
    )]
    NoSettleDatabase {
        /// The path (or the PostgreSQL URL, its password hidden) asked for.
        path: PathBuf,
    },
    /// The file is an SQLite database whose contents are damaged.
    #[error(
        "the database {} is corrupt ({message}); restore it from a backup or move it aside and start a new one",
        path.display()
    )]
    Corrupt {
        /// The path asked for.
        path: PathBuf,
        /// What SQLite reported.
        message: String,
    },
    /// The SQLite database holds tables of another program.
    #[error(
        "the database {} belongs to another program (it has tables but no settle schema); it was left untouched; choose another path",
        path.display()
    )]
    ForeignDatabase {
        /// The path asked for.
        path: PathBuf,
    },
    /// The database was written by a newer settle whose schema this build does
    /// not know.
    #[error(
        "the database {location} has schema version {found}, newer than the {supported} this settle understands; upgrade settle to open it"
    )]
    NewerSchema {
        /// The path or (password-redacted) URL.
        location: String,
        /// The version recorded in the database.
        found: i64,
        /// The newest version this build understands.
        supported: i64,
    },
    /// The database has an older schema and was opened to read it only:
    /// bringing it up to date would write it.
    #[error(
        "the database {location} has schema version {found}, older than the {supported} of this settle, and is opened only to read it: open it once with a command that writes it (as a user who may) to bring it up to date"
    )]
    OlderSchema {
        /// The path or (password-redacted) URL.
        location: String,
        /// The version recorded in the database (0 for none).
        found: i64,
        /// The version this build reads.
        supported: i64,
    },
    /// The SQLite path is empty (an unset variable, an empty `--db`).
    /// SQLite would take it for a temporary database of its own, one per
    /// connection and gone on close, so it is refused.
    #[error(
        "the database path is empty; pass a file path such as settle.db, or a postgres:// URL"
    )]
    EmptyPath,
    /// The path is not valid UTF-8, which SQLite's API needs.
    #[error("the database path {} is not valid UTF-8; choose a path made of UTF-8 characters", path.display())]
    InvalidPath {
        /// The path asked for.
        path: PathBuf,
    },
    /// The PostgreSQL URL could not be understood.
    #[error(
        "the database URL {url} is not valid ({message}); use postgres://user@host:port/database"
    )]
    BadUrl {
        /// The URL, password redacted.
        url: String,
        /// What the client library said.
        message: String,
    },
    /// No PostgreSQL server answered at the URL.
    #[error("cannot reach the PostgreSQL server at {url} ({message}); check that it is running and the host and port are right")]
    Unreachable {
        /// The URL, password redacted.
        url: String,
        /// What the client library said.
        message: String,
    },
    /// The PostgreSQL server answered but has no such database.
    #[error("the PostgreSQL server at {url} has no such database ({message}); create it first (createdb) or fix the URL")]
    MissingDatabase {
        /// The URL, password redacted.
        url: String,
        /// What the server said.
        message: String,
    },
    /// The URL asks for TLS, and this build's libpq has none (the
    /// `postgres-tls` feature of `settle-store` was off).
    #[error("the database URL {url} asks for TLS ({message}), but this settle was built without TLS to PostgreSQL; rebuild with the cargo feature `settle-store/postgres-tls` (it needs OpenSSL's headers, e.g. libssl-dev), or drop sslmode from the URL on a trusted network")]
    TlsNotBuilt {
        /// The URL, password redacted.
        url: String,
        /// What the client library said.
        message: String,
    },
    /// The PostgreSQL server refused the connection (authentication, role, limits).
    #[error("the PostgreSQL server at {url} refused the connection ({message}); check the user, password and server limits")]
    Rejected {
        /// The URL, password redacted.
        url: String,
        /// What the server said.
        message: String,
    },
    /// Bringing the schema up to date failed.
    #[error("cannot bring the schema of {location} up to date ({message}); the database was left as it was")]
    Migration {
        /// The path or (password-redacted) URL.
        location: String,
        /// What failed.
        message: String,
    },
    /// Any other database failure while opening.
    #[error("cannot open the database {location} while {context} ({message})")]
    Database {
        /// The path or (password-redacted) URL.
        location: String,
        /// What `open` was doing.
        context: &'static str,
        /// What the database said.
        message: String,
    },
}

impl OpenError {
    /// Whether the open failed because another connection held the lock
    /// it needed past the busy timeout (the database is in use, not bad).
    pub(crate) fn is_busy(&self) -> bool {
        match self {
            OpenError::Database { message, .. } | OpenError::Migration { message, .. } => {
                crate::open::is_busy_message(message)
            }
            _ => false,
        }
    }
}

/// What SQLite says of a database file that is damaged (`SQLITE_CORRUPT`,
/// `SQLITE_NOTADB`).
const DAMAGED: [&str; 2] = ["database disk image is malformed", "file is not a database"];

/// A database error kept cheaply cloneable, so that one failed group commit can
/// be reported to every chunk of the batch.
#[derive(Clone)]
pub struct DbError(Arc<dyn std::error::Error + Send + Sync>);

impl DbError {
    /// Wraps a database's error (for stores of one's own, and tests).
    pub fn new(e: impl std::error::Error + Send + Sync + 'static) -> Self {
        DbError(Arc::new(e))
    }

    /// Whether the failure may heal on its own, so that the same write may
    /// succeed later: a lock, a full disk, a lost connection, a server
    /// restarting do; a violated constraint (a unique, foreign key, not
    /// null or check constraint) does not, nor does a damaged database
    /// (SQLite's `SQLITE_CORRUPT` and `SQLITE_NOTADB`), which no wait
    /// repairs. (A value PostgreSQL never keeps, a NUL in text, is not
    /// sent: a chunk's is replaced, a name refused before the store. Its
    /// failure fails the writes batched with it, which are tried again
    /// without it once it is given up.)
    pub fn may_heal(&self) -> bool {
        use diesel::result::{DatabaseErrorKind as K, Error as E};
        match self.0.downcast_ref::<E>() {
            Some(E::DatabaseError(
                K::UniqueViolation
                | K::ForeignKeyViolation
                | K::NotNullViolation
                | K::CheckViolation,
                _,
            )) => false,
            // Diesel gives SQLite's code only as its message.
            Some(E::DatabaseError(_, info)) => !DAMAGED
                .iter()
                .any(|damaged| info.message().contains(damaged)),
            _ => true,
        }
    }
}

impl fmt::Debug for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for DbError {
    /// The database's message on one line (libpq ends its messages with a
    /// line break); Diesel's "the transaction manager is broken", which is
    /// what a connection lost in the middle of a transaction leaves, said
    /// as what it means.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(diesel::result::Error::BrokenTransactionManager) =
            self.0.downcast_ref::<diesel::result::Error>()
        {
            return f.write_str(
                "the connection to the database was lost in the middle of a transaction \
                 (a server restart, a dropped connection); it is opened again for the next write",
            );
        }
        f.write_str(&one_line(&self.0.to_string()))
    }
}

/// A database's message on one line: each of its lines trimmed (libpq
/// indents its hints and ends with a line break), the empty ones left
/// out, the rest joined by a space.
pub(crate) fn one_line(text: &str) -> String {
    let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
    let mut joined = lines.next().unwrap_or_default().to_owned();
    for line in lines {
        joined.push(' ');
        joined.push_str(line);
    }
    joined
}

impl std::error::Error for DbError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// Why an operation on an open [`Store`](crate::Store) failed.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The session is finalized: it accepts no more writes (G10). Its row is
    /// unchanged.
    #[error("session {0} is finalized and accepts no more writes; start a new session")]
    SessionClosed(SessionId),
    /// The turn has ended: it accepts no more chunks. This is how the write
    /// access of a detached work is revoked.
    #[error("turn {turn} of session {session} has ended and accepts no more chunks; its work's write access was revoked")]
    TurnClosed {
        /// The session.
        session: SessionId,
        /// The turn number.
        turn: u32,
    },
    /// No session with this id exists in the store.
    #[error("there is no session {0} in this store; check the id (`settle sessions` lists them)")]
    UnknownSession(SessionId),
    /// The session has no turn with this number.
    #[error("session {session} has no turn {turn}; start the turn before writing to it")]
    UnknownTurn {
        /// The session.
        session: SessionId,
        /// The turn number.
        turn: u32,
    },
    /// A turn with this number was already started in the session.
    #[error("session {session} already has a turn {turn}; number each turn of a session once")]
    TurnExists {
        /// The session.
        session: SessionId,
        /// The turn number.
        turn: u32,
    },
    /// Another turn of the session is still open.
    #[error("session {session} still has turn {open} open; end it before starting another")]
    TurnInFlight {
        /// The session.
        session: SessionId,
        /// The turn that is still open.
        open: u32,
    },
    /// The session is marked closing for a reclaim and admits no new turn.
    /// The reclaim claim is the core's (SPEC §5); the store keeps the mark
    /// only on rows an earlier version of settle claimed in the database.
    #[error("session {session} is closing ({reason}) and admits no new turn")]
    SessionClosing {
        /// The session.
        session: SessionId,
        /// Why it is closing.
        reason: EndReason,
    },
    /// The session is in a state that admits no new turn.
    #[error("session {session} is {state} and admits no new turn; only a registered or running session does")]
    NotAcceptingTurns {
        /// The session.
        session: SessionId,
        /// Its state.
        state: State,
    },
    /// A conditional transition found the session in another state.
    #[error("session {session} was expected to be {expected} but is {found}; the transition was not applied")]
    StateMismatch {
        /// The session.
        session: SessionId,
        /// The state the caller expected.
        expected: State,
        /// The state the session is in.
        found: State,
    },
    /// The transition is not one of the lifecycle's (SPEC §2).
    #[error("{from} → {to} is not a lifecycle transition (states never move backwards, and only finalize reaches finalized)")]
    InvalidTransition {
        /// The session.
        session: SessionId,
        /// The state moved from.
        from: State,
        /// The state asked for.
        to: State,
    },
    /// The parent of a new session is settled or finalized.
    #[error("session {parent} is {state} and cannot take a new child; register the child under an open session")]
    ParentClosed {
        /// The parent asked for.
        parent: SessionId,
        /// Its state.
        state: State,
    },
    /// No owner with this id is registered.
    #[error("there is no owner {0} in this store; register the process with register_owner first")]
    UnknownOwner(OwnerId),
    /// The owner's lease expired before it was renewed, so its sessions may
    /// already have been recovered by another process.
    #[error("the lease of owner {0} expired before it was renewed; its sessions may have been recovered; register the process again")]
    LeaseLost(OwnerId),
    /// The session is not this process's to write: it was handed off to
    /// another process of the fleet, or adopted by one (SPEC §12, G12).
    #[error("session {session} is not owned by this process (owner {owner}): it was handed off; use it where it is adopted")]
    HandedOff {
        /// The session.
        session: SessionId,
        /// The process that asked to write it.
        owner: OwnerId,
    },
    /// Another live process owns the session (SPEC §12): a client reaches
    /// it at `advertise`, if that process said where.
    #[error("session {session} is owned by another live process{}", match .advertise { Some(url) => format!(" at {url}"), None => String::new() })]
    Elsewhere {
        /// The session.
        session: SessionId,
        /// The advertised URL of the process that owns it.
        advertise: Option<String>,
    },
    /// The session is not released: there is nothing to adopt.
    #[error("session {session} is {state} and not released by any process; it cannot be adopted")]
    NotReleased {
        /// The session.
        session: SessionId,
        /// Its state.
        state: State,
    },
    /// This store keeps no fleet (one process only): handoff and adoption
    /// need the database store.
    #[error("this store does not support {0}; use the database store (PostgreSQL for a fleet)")]
    Unsupported(&'static str),
    /// A session with this id exists already: ids come from
    /// [`reserve_ids`](crate::SessionStore::reserve_ids), each used once.
    #[error(
        "session {0} exists already; register new sessions under ids from reserve_ids, each once"
    )]
    DuplicateSession(SessionId),
    /// A row holds a value this build does not understand.
    #[error("the database holds an unexpected value {} in {column}{}; it may have been written by a newer settle", quoted(.value), .session.map(|id| format!(" of session {id}")).unwrap_or_default())]
    Corrupt {
        /// The session whose row holds it, where known: the one row to
        /// look at among many.
        session: Option<i64>,
        /// Which column.
        column: &'static str,
        /// The value found.
        value: String,
    },
    /// A number does not fit the database's 64-bit signed integers.
    #[error("{what} {value} is too large for the database")]
    OutOfRange {
        /// What the number is.
        what: &'static str,
        /// The number.
        value: u64,
    },
    /// The database reported an error.
    #[error("the database failed while {context}: {source}")]
    Database {
        /// What the store was doing.
        context: &'static str,
        /// The database's error.
        source: DbError,
    },
    /// No pooled read connection could be had.
    #[error("no database connection became free for reading: {source}; check that the database is reachable")]
    Connection {
        /// The pool's error.
        source: DbError,
    },
    /// The writer thread has stopped, so nothing more can be written.
    #[error("the store's writer has stopped; open the store again")]
    Unavailable,
    /// The store's call panicked (a store of the caller's own with a bug):
    /// what it was asked is not known to be written, and is not tried again.
    #[error("the store panicked while {call}; what was asked may not be written")]
    Panicked {
        /// What the store was asked.
        call: &'static str,
    },
    /// The store did not answer within the bound asked of it. What was
    /// asked may still be committed once it answers: a caller told this
    /// must not take it as not written.
    #[error("{}", timed_out(.after))]
    TimedOut {
        /// The bound.
        after: std::time::Duration,
    },
}

impl StoreError {
    /// Whether the failure may heal on its own, so that the same write is
    /// worth trying again: the database failed (but for a violated
    /// constraint, see [`DbError::may_heal`]), gave no connection, or the
    /// writer or the store did not answer. A refusal (a closed session, a
    /// lost lease, a state that does not allow it) is final.
    pub fn may_heal(&self) -> bool {
        match self {
            StoreError::Database { source, .. } | StoreError::Connection { source } => {
                source.may_heal()
            }
            StoreError::Unavailable | StoreError::TimedOut { .. } => true,
            _ => false,
        }
    }
}

/// What [`StoreError::TimedOut`] says: how long the store was waited for,
/// or, with no time left to wait (a shutdown's time for the store's writes
/// spent), that it was not waited for at all.
fn timed_out(after: &std::time::Duration) -> String {
    match after.is_zero() {
        true => "the store was not waited for: the time allowed for its writes had run out; \
                 what was asked may still be written"
            .to_owned(),
        false => format!(
            "the store did not answer within {after:?}; what was asked may still be written"
        ),
    }
}

impl From<diesel::result::Error> for StoreError {
    fn from(e: diesel::result::Error) -> Self {
        StoreError::Database {
            context: "running a transaction",
            source: DbError::new(e),
        }
    }
}

/// Attach what the store was doing to a Diesel error.
pub(crate) trait Context<T> {
    fn context(self, what: &'static str) -> Result<T, StoreError>;
}

impl<T> Context<T> for Result<T, diesel::result::Error> {
    fn context(self, what: &'static str) -> Result<T, StoreError> {
        self.map_err(|e| StoreError::Database {
            context: what,
            source: DbError::new(e),
        })
    }
}

/// The most characters of a stored value an error quotes.
const QUOTED_CHARS: usize = 80;

impl StoreError {
    /// This error, said of session `id`'s row when it is an unexpected
    /// value read from it.
    pub(crate) fn of_session(self, id: i64) -> StoreError {
        match self {
            StoreError::Corrupt { column, value, .. } => StoreError::Corrupt {
                session: Some(id),
                column,
                value,
            },
            other => other,
        }
    }
}

/// A stored value as an error quotes it: escaped (`{:?}`), and cut to
/// [`QUOTED_CHARS`] with its size said, so that one value of megabytes
/// does not make a line of megabytes.
fn quoted(value: &str) -> String {
    match value.char_indices().nth(QUOTED_CHARS) {
        None => format!("{value:?}"),
        Some((end, _)) => format!("{:?}… ({} bytes)", &value[..end], value.len()),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_unexpected_value_of_megabytes_is_quoted_short() {
        let huge = StoreError::Corrupt {
            session: None,
            column: "turns.input",
            value: "x".repeat(10 << 20),
        }
        .to_string();
        assert!(huge.len() < 300, "{} bytes", huge.len());
        assert!(huge.contains("(10485760 bytes)"), "{huge}");
        let short = StoreError::Corrupt {
            session: None,
            column: "sessions.state",
            value: "weird".to_owned(),
        };
        assert!(short.to_string().contains("\"weird\" in sessions.state"));
    }

    use super::*;

    #[test]
    fn a_database_error_reads_on_one_line_and_a_broken_transaction_as_a_lost_connection() {
        use diesel::result::{DatabaseErrorKind as K, Error as E};
        let lost = E::DatabaseError(
            K::ClosedConnection,
            Box::new("server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally\n".to_owned()),
        );
        assert_eq!(
            DbError::new(lost).to_string(),
            "server closed the connection unexpectedly This probably means the server terminated abnormally"
        );
        let broken = DbError::new(E::BrokenTransactionManager).to_string();
        assert!(
            broken.contains("connection to the database was lost"),
            "{broken}"
        );
    }

    #[test]
    fn a_lock_or_a_lost_connection_may_heal_and_a_violated_constraint_does_not() {
        use diesel::result::{DatabaseErrorKind as K, Error as E};
        let db = |kind: K| StoreError::from(E::DatabaseError(kind, Box::new("detail".to_owned())));
        assert!(db(K::Unknown).may_heal(), "database is locked, disk full");
        assert!(db(K::ClosedConnection).may_heal());
        assert!(db(K::SerializationFailure).may_heal());
        assert!(!db(K::UniqueViolation).may_heal());
        assert!(!db(K::ForeignKeyViolation).may_heal());
        let said = |message: &str| {
            StoreError::from(E::DatabaseError(K::Unknown, Box::new(message.to_owned())))
        };
        assert!(!said("database disk image is malformed").may_heal());
        assert!(!said("file is not a database").may_heal());
        assert!(said("database is locked").may_heal());
        assert!(StoreError::Database {
            context: "writing",
            source: DbError::new(std::io::Error::other("database is locked")),
        }
        .may_heal());
        assert!(StoreError::Unavailable.may_heal());
        assert!(!StoreError::SessionClosed(SessionId(1)).may_heal());
        assert!(!StoreError::LeaseLost(OwnerId(1)).may_heal());
    }
}
