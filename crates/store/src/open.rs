//! Opening a store: telling a path from a URL, refusing bad locations before
//! anything is written (G11), checking the schema version, running the embedded
//! migrations, and building the connections.
//!
//! For SQLite the order is: look at the path (missing folder, directory,
//! read-only location) and, for an existing file, read its header before SQLite
//! may touch it; open one connection; set the busy timeout; read the schema
//! (which finds a corrupt file) and refuse a newer or foreign one; only then
//! switch to WAL and migrate, inside an IMMEDIATE transaction so two processes
//! opening a new file at once migrate it once (the switch to WAL, which
//! SQLite refuses at once while another connection holds the file, is tried
//! again within the busy timeout). A file this call created is removed again
//! if a later step fails, unless it failed on another connection's lock:
//! then the file is in use by whoever holds it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::prelude::*;
use diesel::r2d2::{ConnectionManager, Pool};
use diesel::sql_types::Text;
use diesel::sqlite::SqliteConnection;
use diesel::ConnectionError;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};

use crate::conn::{AnyConn, Db};
use crate::error::OpenError;
use crate::options::StoreOptions;
use crate::pool::{sqlite_pragmas, QuietErrors, ReadPool, SqliteSettings, POOL_CONNECTION_TIMEOUT};
use crate::redact::{redact, scrub};
use crate::schema::{settle_meta, SCHEMA_VERSION, SCHEMA_VERSION_KEY};

const SQLITE_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/sqlite");
const PG_MIGRATIONS: EmbeddedMigrations = embed_migrations!("migrations/postgres");

/// Serialises migrations of one PostgreSQL database across processes.
const PG_MIGRATION_LOCK: i64 = 0x5e77_1e00;

/// The mode of a SQLite database file the store creates: read and write
/// for its owner only (less what the process's umask takes away).
const NEW_DATABASE_MODE: u32 = 0o600;

/// The first 16 bytes of every SQLite database file.
const SQLITE_MAGIC: &[u8; 16] = b"SQLite format 3\0";

/// What `open` produced.
pub(crate) struct Opened {
    pub(crate) writer: AnyConn,
    pub(crate) pool: ReadPool,
    /// For PostgreSQL: the connection leases are renewed on, apart from
    /// the writer's (see [`Store`](crate::Store)'s `renew_lease`).
    pub(crate) lease: Option<ReadPool>,
    /// For SQLite: the path the checkpoint thread opens.
    pub(crate) checkpoint: Option<String>,
}

/// Where a URL points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Target {
    pub(crate) fn parse(url: &str) -> Target {
        // A URL's scheme is case-insensitive (RFC 3986); libpq reads only
        // the lower-case one.
        for scheme in ["postgres://", "postgresql://"] {
            if let Some(rest) = strip_prefix_in_any_case(url, scheme) {
                return Target::Postgres(format!("{scheme}{rest}"));
            }
        }
        // `sqlite://` or `sqlite:` (in any case) before a path.
        let path = ["sqlite://", "sqlite:"]
            .iter()
            .find_map(|prefix| strip_prefix_in_any_case(url, prefix))
            .unwrap_or(url);
        Target::Sqlite(PathBuf::from(path))
    }

    /// How to name this location in messages (passwords redacted).
    pub(crate) fn describe(&self) -> String {
        match self {
            Target::Sqlite(p) => p.display().to_string(),
            Target::Postgres(u) => redact(u),
        }
    }
}

/// `text` after `prefix`, the prefix's ASCII letters in any case.
fn strip_prefix_in_any_case<'a>(text: &'a str, prefix: &str) -> Option<&'a str> {
    text.get(..prefix.len())
        .filter(|head| head.eq_ignore_ascii_case(prefix))
        .and_then(|_| text.get(prefix.len()..))
}

pub(crate) fn open(target: &Target, options: &StoreOptions) -> Result<Opened, OpenError> {
    match target {
        Target::Sqlite(path) => open_sqlite(path, options),
        Target::Postgres(url) => open_postgres(url, options),
    }
}

// --- SQLite ---------------------------------------------------------------

/// libpq's connection keywords (PostgreSQL 15's list): a location that
/// sets one (`key=value`, spaces allowed around `=`) is a keyword string.
const LIBPQ_KEYWORDS: [&str; 41] = [
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "passfile",
    "require_auth",
    "channel_binding",
    "connect_timeout",
    "client_encoding",
    "options",
    "application_name",
    "fallback_application_name",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
    "tcp_user_timeout",
    "replication",
    "gssencmode",
    "sslmode",
    "requiressl",
    "sslcompression",
    "sslcert",
    "sslkey",
    "sslpassword",
    "sslcertmode",
    "sslrootcert",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "target_session_attrs",
    "load_balance_hosts",
];

/// Whether `path` sets a libpq keyword (`key=value`, `key = value`)
/// anywhere: the word before any `=` is one of [`LIBPQ_KEYWORDS`].
fn is_conn_string(path: &str) -> bool {
    let mut rest = path;
    while let Some(at) = rest.find('=') {
        let key = rest[..at]
            .trim_end()
            .rsplit(|c: char| c.is_whitespace())
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        if LIBPQ_KEYWORDS.contains(&key.as_str()) {
            return true;
        }
        rest = &rest[at + 1..];
    }
    false
}

/// Why a location taken for an SQLite path is none.
pub(crate) enum NotAFile {
    /// libpq's `key=value` words (which may hold a password).
    ConnString,
    /// A URL, or a PostgreSQL one without its `//`.
    Url(&'static str),
}

/// Refuses what is meant for another kind of store, before SQLite would
/// create a file of that name: a URL of any scheme but `sqlite:` (a
/// `mysql://…`, an `http://…`), `postgres:` without its `//`, and libpq's
/// keyword string (`host=… dbname=…`), whose password would otherwise
/// name a file and be echoed in every message about it.
pub(crate) fn check_not_a_url(path: &str) -> Result<(), NotAFile> {
    if is_conn_string(path) {
        return Err(NotAFile::ConnString);
    }
    let scheme_len = path.find(':').filter(|&n| n > 1).filter(|&n| {
        let scheme = &path[..n];
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '.' | '-'))
    });
    // A URL inside quotes, brackets or spaces (an env file that keeps its
    // quotes, a paste): no file path holds `://` but after a scheme.
    let url_at_start = scheme_len.is_some_and(|n| path[n..].starts_with("://"));
    if path.contains("://") && !url_at_start {
        return Err(NotAFile::Url(
            "a URL with quotes, brackets or spaces around it (pass it bare)",
        ));
    }
    if let Some(n) = scheme_len {
        let scheme = path[..n].to_ascii_lowercase();
        if scheme == "postgres" || scheme == "postgresql" {
            return Err(NotAFile::Url(
                "a PostgreSQL URL begins postgres:// (postgres://user@host:port/database)",
            ));
        }
        if path[n..].starts_with("://") && scheme != "sqlite" {
            return Err(NotAFile::Url(
                "a URL of a kind the store does not take (only postgres:// URLs and SQLite paths)",
            ));
        }
    }
    Ok(())
}

/// What the path looked like before `open` touched it.
enum Before {
    /// A database file (or an empty file) was there.
    Existing,
    /// Nothing was there; these are the files to remove if `open` fails.
    Nothing(Vec<PathBuf>),
}

/// Refuses, touching nothing, an SQLite location that names no file (see
/// [`check_not_a_url`]); the path as SQLite's API takes it otherwise.
pub(crate) fn check_sqlite_path(path: &Path) -> Result<&str, OpenError> {
    if path.as_os_str().is_empty() {
        return Err(OpenError::EmptyPath);
    }
    let Some(path_str) = path.to_str() else {
        return Err(OpenError::InvalidPath {
            path: path.to_owned(),
        });
    };
    let not_a_path = |reason| OpenError::NotAPath {
        path: path.to_owned(),
        reason,
    };
    if path_str == ":memory:" {
        return Err(not_a_path(
            "an in-memory SQLite database keeps nothing and cannot be shared by the store's connections",
        ));
    }
    if path_str.starts_with("file:") {
        return Err(not_a_path("an SQLite URI is not taken"));
    }
    check_not_a_url(path_str).map_err(|reason| match reason {
        NotAFile::ConnString => OpenError::ConnString,
        // Named as a URL is, its password masked; a PostgreSQL one
        // without its `//` may not parse as one: its scheme only.
        NotAFile::Url(reason) => OpenError::NotAPath {
            path: PathBuf::from(match path_str.contains("://") {
                true => redact(path_str),
                false => format!("{}…", path_str.find(':').map_or("", |n| &path_str[..=n])),
            }),
            reason,
        },
    })?;
    Ok(path_str)
}

fn open_sqlite(path: &Path, options: &StoreOptions) -> Result<Opened, OpenError> {
    let path_str = check_sqlite_path(path)?;
    let before = preflight(path, options.existing_only(), options.read_only())?;
    let opened = establish_sqlite(path, path_str, options);
    // A file this open made is removed again when it failed, unless it
    // failed on a lock: then another process has the file open (two
    // opening one new file at once), and it is that process's file too.
    if let (Err(e), Before::Nothing(created)) = (&opened, &before) {
        if e.is_busy() {
            return opened;
        }
        for file in created {
            if let Err(e) = fs::remove_file(file) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(file = %file.display(), error = %e, "could not remove a file left by a failed open");
                }
            }
        }
    }
    opened
}

/// Refuse a bad location before SQLite sees it; one opened `to_read` only
/// must be a file this process may read.
fn preflight(path: &Path, existing_only: bool, to_read: bool) -> Result<Before, OpenError> {
    let read_only = |e: io::Error| OpenError::ReadOnly {
        path: path.to_owned(),
        reason: e.to_string(),
    };
    match fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(OpenError::IsDirectory {
            path: path.to_owned(),
        }),
        Ok(meta) if !meta.is_file() => Err(OpenError::NotADatabase {
            path: path.to_owned(),
        }),
        Ok(_) => {
            let mut header = Vec::with_capacity(100);
            File::open(path)
                .and_then(|f| f.take(100).read_to_end(&mut header))
                .map_err(|e| OpenError::Unreadable {
                    path: path.to_owned(),
                    reason: e.to_string(),
                })?;
            // An empty file is a database with no pages yet; anything else
            // must carry SQLite's header.
            if !header.is_empty() && (header.len() < 100 || !header.starts_with(SQLITE_MAGIC)) {
                return Err(OpenError::NotADatabase {
                    path: path.to_owned(),
                });
            }
            if header.is_empty() && existing_only {
                return Err(OpenError::NoSettleDatabase {
                    path: path.to_owned(),
                });
            }
            if to_read {
                return Ok(Before::Existing);
            }
            // Opening for writing (without truncating) writes nothing.
            OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(read_only)?;
            // WAL keeps two files beside the database.
            crate::sys::writable(&folder_of(path)).map_err(read_only)?;
            Ok(Before::Existing)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound && to_read => {
            Err(OpenError::NoSettleDatabase {
                path: path.to_owned(),
            })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            // A link to nothing: SQLite would not create its target, and a
            // failed open must not remove the link as a file it made.
            if let Ok(target) = fs::read_link(path) {
                return Err(OpenError::DanglingLink {
                    path: path.to_owned(),
                    target,
                });
            }
            let folder = folder_of(path);
            match fs::metadata(&folder) {
                Ok(meta) if meta.is_dir() => {}
                Ok(_) => {
                    return Err(OpenError::MissingFolder {
                        path: path.to_owned(),
                        folder,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(OpenError::MissingFolder {
                        path: path.to_owned(),
                        folder,
                    })
                }
                Err(e) => return Err(read_only(e)),
            }
            crate::sys::writable(&folder).map_err(read_only)?;
            let mut created: Vec<PathBuf> = ["", "-wal", "-shm", "-journal"]
                .iter()
                .map(|suffix| {
                    let mut p = path.as_os_str().to_owned();
                    p.push(suffix);
                    PathBuf::from(p)
                })
                // Not there, not even as a link: only what this open makes
                // is removed if it fails.
                .filter(|p| fs::symlink_metadata(p).is_err())
                .collect();
            // The file is made here, for its owner only: transcripts hold
            // what users typed. SQLite gives the log and its index the
            // database's mode. One made meanwhile by another process is
            // that process's (and is not removed if this open fails).
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(NEW_DATABASE_MODE)
                .open(path)
            {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    created.retain(|p| p.as_path() != path);
                }
                Err(e) => return Err(read_only(e)),
            }
            Ok(Before::Nothing(created))
        }
        Err(e) => Err(read_only(e)),
    }
}

/// Runs `step` again while SQLite answers that another connection holds
/// the lock it needs, for up to `busy` in all (a short wait, doubling to
/// 100 ms). Switching a file to WAL needs the file to itself, and SQLite
/// answers that switch at once instead of calling its busy handler: a new
/// file another process is creating, or one a `sqlite3` shell holds in a
/// transaction, would be refused although the lock goes a moment later.
fn while_busy<T>(
    busy: std::time::Duration,
    mut step: impl FnMut() -> QueryResult<T>,
) -> QueryResult<T> {
    let until = std::time::Instant::now() + busy;
    let mut wait = std::time::Duration::from_millis(5);
    loop {
        match step() {
            Err(e) if is_busy_message(&e.to_string()) => {
                if std::time::Instant::now() + wait > until {
                    return Err(e);
                }
                std::thread::sleep(wait);
                wait = (wait * 2).min(std::time::Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// Whether SQLite's `message` says another connection holds a lock.
pub(crate) fn is_busy_message(message: &str) -> bool {
    let lower = message.to_lowercase();
    lower.contains("database is locked") || lower.contains("database is busy")
}

fn folder_of(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    }
}

/// Turn an SQLite error met while opening into the matching refusal.
fn sqlite_refusal(path: &Path, context: &'static str, message: String) -> OpenError {
    let lower = message.to_lowercase();
    if lower.contains("not a database") {
        OpenError::NotADatabase {
            path: path.to_owned(),
        }
    } else if lower.contains("malformed") || lower.contains("corrupt") {
        OpenError::Corrupt {
            path: path.to_owned(),
            message,
        }
    } else if lower.contains("readonly") || lower.contains("read-only") {
        OpenError::ReadOnly {
            path: path.to_owned(),
            reason: message,
        }
    } else {
        OpenError::Database {
            location: path.display().to_string(),
            context,
            message,
        }
    }
}

fn establish_sqlite(
    path: &Path,
    path_str: &str,
    options: &StoreOptions,
) -> Result<Opened, OpenError> {
    if options.read_only() {
        return establish_sqlite_read_only(path, options);
    }
    let location = path.display().to_string();
    log_sqlite_build();
    let mut conn = SqliteConnection::establish(path_str)
        .map_err(|e| sqlite_refusal(path, "connecting", e.to_string()))?;
    let [busy, rest @ ..] = sqlite_pragmas(options.busy_timeout(), options.durability());
    conn.batch_execute(&busy)
        .map_err(|e| sqlite_refusal(path, "setting the busy timeout", e.to_string()))?;
    // Reading the schema reads page 1 and the schema table: a damaged file
    // fails here, before anything is written.
    let schema = check_schema(Db::Sqlite(&mut conn), true, options.existing_only())
        .map_err(|r| r.into_open(path, &location))?;
    // Checkpoints run on their own thread (see `checkpoint`), not inside
    // the writer's commits.
    // The log is started over past its limit (see `checkpoint`), and cut
    // back to the limit then: not emptied, as SQLite overwrites a log
    // faster than it appends to one.
    let size_limit = format!(
        "PRAGMA journal_size_limit = {}",
        i64::try_from(options.wal_limit()).unwrap_or(-1)
    );
    for pragma in rest
        .iter()
        .map(String::as_str)
        .chain(["PRAGMA wal_autocheckpoint = 0", size_limit.as_str()])
    {
        while_busy(options.busy_timeout(), || conn.batch_execute(pragma))
            .map_err(|e| sqlite_refusal(path, "configuring the connection", e.to_string()))?;
    }
    // Only a schema to create or bring up to date takes the write lock: a
    // current one is opened while another process writes (a reading
    // command beside a running gateway), as a reader of WAL never waits.
    if matches!(schema, Schema::ToBring(_)) {
        conn.immediate_transaction(|c| {
            let _ = check_schema(Db::Sqlite(&mut *c), true, options.existing_only())?;
            c.run_pending_migrations(SQLITE_MIGRATIONS)
                .map_err(|e| Refusal::Migration(e.to_string()))?;
            Ok::<_, Refusal>(())
        })
        .map_err(|r| r.into_open(path, &location))?;
    }

    Ok(Opened {
        writer: AnyConn::Sqlite(conn),
        pool: sqlite_pool(path_str, options, false),
        lease: None,
        checkpoint: Some(path_str.to_owned()),
    })
}

/// The read connections of an SQLite store at `url` (a path, or the URI of
/// a store opened `read_only`), each set up as the writer is.
fn sqlite_pool(url: &str, options: &StoreOptions, read_only: bool) -> ReadPool {
    let pool = Pool::builder()
        .max_size(options.read_connections())
        .min_idle(Some(0))
        .connection_timeout(POOL_CONNECTION_TIMEOUT)
        .thread_pool(pool_threads())
        .error_handler(Box::new(QuietErrors))
        .connection_customizer(Box::new(SqliteSettings {
            busy_timeout: options.busy_timeout(),
            durability: options.durability(),
            read_only,
        }))
        .build_unchecked(ConnectionManager::<SqliteConnection>::new(url));
    ReadPool::sqlite(pool, options.connection_timeout())
}

/// Opens an existing SQLite store to read it only
/// ([`StoreOptions::read_only`]): the file through an SQLite URI with
/// `mode=ro`, so that a file and a folder this process may only read are
/// read, and nothing is migrated, switched to WAL or checkpointed. A reader
/// of a WAL file shares its `-shm` index with the file's writers: where one
/// has the file open the index is there and is read as it is. Where nobody
/// has it open, no log is left beside it (the last writer folded it back
/// and removed it) and this process may not make the index (SQLite answers
/// that it would write a read-only database, or on a read-only mount that
/// it cannot open the file), the file holds every commit: it is read as a
/// file nobody changes (`immutable=1`).
fn establish_sqlite_read_only(path: &Path, options: &StoreOptions) -> Result<Opened, OpenError> {
    let location = path.display().to_string();
    log_sqlite_build();
    let attempt = |immutable: bool| -> Result<(SqliteConnection, String), OpenError> {
        let uri = read_only_uri(path, immutable);
        let mut conn = SqliteConnection::establish(&uri)
            .map_err(|e| sqlite_refusal(path, "connecting", e.to_string()))?;
        let [busy, ..] = sqlite_pragmas(options.busy_timeout(), options.durability());
        conn.batch_execute(&busy)
            .map_err(|e| sqlite_refusal(path, "setting the busy timeout", e.to_string()))?;
        match check_schema(Db::Sqlite(&mut conn), true, true)
            .map_err(|r| r.into_open(path, &location))?
        {
            Schema::Current => Ok((conn, uri)),
            Schema::ToBring(found) => Err(OpenError::OlderSchema {
                location: location.clone(),
                found,
                supported: SCHEMA_VERSION,
            }),
        }
    };
    let mut log = path.as_os_str().to_owned();
    log.push("-wal");
    // Where the index may not be made, SQLite says it would write a
    // read-only database, or (on a read-only mount) that it cannot open
    // the file at all.
    let no_index = |e: &OpenError| match e {
        OpenError::ReadOnly { .. } => true,
        OpenError::Database { message, .. } => message.contains("unable to open database file"),
        _ => false,
    };
    let (conn, uri) = match attempt(false) {
        Err(e) if no_index(&e) && fs::symlink_metadata(&log).is_err() => attempt(true)?,
        // A log is there, and its index cannot be made: the file alone
        // is not every commit, so it is not read as immutable.
        Err(e) if no_index(&e) => {
            return Err(OpenError::LogWithoutIndex {
                path: path.to_owned(),
            })
        }
        other => other?,
    };
    Ok(Opened {
        writer: AnyConn::Sqlite(conn),
        pool: sqlite_pool(&uri, options, true),
        lease: None,
        checkpoint: None,
    })
}

/// The SQLite URI that opens `path` read-only (`immutable` too, when
/// asked): `file:` and the path, every byte but letters, digits, `-._~/`
/// escaped, so that a `?`, `#` or `%` in a file name stays in it.
fn read_only_uri(path: &Path, immutable: bool) -> String {
    use std::fmt::Write as _;
    use std::os::unix::ffi::OsStrExt as _;
    let mut uri = String::from("file:");
    for &byte in path.as_os_str().as_bytes() {
        if byte.is_ascii_alphanumeric() || b"-._~/".contains(&byte) {
            uri.push(char::from(byte));
        } else {
            let _ = write!(uri, "%{byte:02X}");
        }
    }
    uri.push_str(if immutable {
        "?mode=ro&immutable=1"
    } else {
        "?mode=ro"
    });
    uri
}

/// The threads of a read pool (they open its connections and reap idle
/// ones), which end when the pool is dropped. r2d2's own pool keeps its
/// three threads for the life of the process (its reaper is a job at a
/// fixed rate, and its pool completes pending jobs before it ends), so a
/// program that opens a store per job grew three threads per store.
fn pool_threads() -> std::sync::Arc<scheduled_thread_pool::ScheduledThreadPool> {
    std::sync::Arc::new(
        scheduled_thread_pool::ScheduledThreadPool::builder()
            .num_threads(2)
            .thread_name_pattern("settle-pool-{}")
            .on_drop_behavior(scheduled_thread_pool::OnPoolDropBehavior::DiscardPendingScheduled)
            .build(),
    )
}

/// Says once per process which SQLite build the store runs on.
fn log_sqlite_build() {
    static LOGGED: std::sync::Once = std::sync::Once::new();
    LOGGED.call_once(|| match crate::sqlite_threading() {
        Ok(crate::SqliteThreading::MultiThread) => {
            tracing::debug!("SQLite built multi-threaded, as benchmarked");
        }
        Ok(mode) => tracing::info!(
            ?mode,
            "SQLite is not built multi-threaded; set LIBSQLITE3_FLAGS=\"-USQLITE_THREADSAFE -DSQLITE_THREADSAFE=2\" in the program's .cargo/config.toml [env] for the benchmarked build"
        ),
        Err(error) => tracing::debug!(%error, "could not read how SQLite was built"),
    });
}

// --- PostgreSQL -----------------------------------------------------------

fn open_postgres(url: &str, options: &StoreOptions) -> Result<Opened, OpenError> {
    let shown = redact(url);
    let sent = options.bounded_pg_url(url);
    let mut conn = PgConnection::establish(&sent).map_err(|e| pg_refusal(url, &sent, e))?;
    let url = &sent;
    let existing_only = options.existing_only();
    let schema = check_schema(Db::Pg(&mut conn), false, existing_only)
        .map_err(|r| r.into_open_pg(&shown))?;
    match schema {
        Schema::ToBring(found) if options.read_only() => {
            return Err(OpenError::OlderSchema {
                location: shown,
                found,
                supported: SCHEMA_VERSION,
            })
        }
        // A current schema takes no lock and writes nothing (a reader's
        // role may not write), as on SQLite.
        Schema::Current => {}
        Schema::ToBring(_) => migrate_postgres(&mut conn, existing_only, &shown)?,
    }
    let pool = Pool::builder()
        .max_size(options.read_connections())
        .min_idle(Some(0))
        .connection_timeout(POOL_CONNECTION_TIMEOUT)
        .thread_pool(pool_threads())
        .error_handler(Box::new(QuietErrors))
        .build_unchecked(ConnectionManager::<PgConnection>::new(url));
    // One connection of its own, reopened by the pool when it breaks.
    let lease = Pool::builder()
        .max_size(1)
        .min_idle(Some(0))
        .connection_timeout(POOL_CONNECTION_TIMEOUT)
        .thread_pool(pool_threads())
        .error_handler(Box::new(QuietErrors))
        .build_unchecked(ConnectionManager::<PgConnection>::new(url));
    Ok(Opened {
        writer: AnyConn::Pg(conn),
        pool: ReadPool::pg(pool, options.connection_timeout()),
        lease: Some(ReadPool::pg(lease, options.connection_timeout())),
        checkpoint: None,
    })
}

/// Brings a PostgreSQL store's schema up to date, once across processes
/// (under an advisory lock).
fn migrate_postgres(
    conn: &mut PgConnection,
    existing_only: bool,
    shown: &str,
) -> Result<(), OpenError> {
    conn.transaction(|c| {
        diesel::sql_query(format!("SELECT pg_advisory_xact_lock({PG_MIGRATION_LOCK})"))
            .execute(c)?;
        let _ = check_schema(Db::Pg(&mut *c), false, existing_only)?;
        c.run_pending_migrations(PG_MIGRATIONS)
            .map_err(|e| Refusal::Migration(e.to_string()))?;
        Ok::<_, Refusal>(())
    })
    .map_err(|r| r.into_open_pg(shown))?;
    Ok(())
}

/// Why libpq refused `url` (sent as `sent`), its message cleaned of the
/// password (libpq may quote the URL back, or a piece of it).
fn pg_refusal(url: &str, sent: &str, e: ConnectionError) -> OpenError {
    let clean = |message: &str| scrub(message.trim(), url, sent);
    let url = redact(url);
    match e {
        ConnectionError::InvalidConnectionUrl(message) => OpenError::BadUrl {
            url,
            message: clean(&message),
        },
        ConnectionError::BadConnection(message) => {
            let message = clean(&message);
            let lower = message.to_lowercase();
            if lower.contains("ssl support is not compiled in") {
                OpenError::TlsNotBuilt { url, message }
            } else if is_malformed(&lower) {
                OpenError::BadUrl { url, message }
            } else if lower.contains("database \"") && lower.contains("does not exist") {
                OpenError::MissingDatabase { url, message }
            } else if lower.contains("fatal") {
                OpenError::Rejected { url, message }
            } else {
                OpenError::Unreachable { url, message }
            }
        }
        other => OpenError::Rejected {
            url,
            message: clean(&other.to_string()),
        },
    }
}

/// Whether libpq's message (lower case) says it could not read the URL
/// itself, before any connection was tried: its URI parser's and its
/// option checks' messages.
fn is_malformed(lower: &str) -> bool {
    const SAYINGS: [&str; 13] = [
        " in uri",
        "unexpected spaces found",
        "invalid uri",
        "invalid percent-encoded token",
        "forbidden value %00",
        "invalid port number",
        "invalid integer value",
        "invalid connection option",
        "key/value separator",
        "missing \"=\" after",
        "unterminated quoted string",
        "could not match",
        "invalid uri query parameter",
    ];
    if SAYINGS.iter().any(|saying| lower.contains(saying)) {
        return true;
    }
    // `invalid sslmode value: "bogus"` and the like, for every option
    // that takes one of a set of words.
    lower
        .split("invalid ")
        .skip(1)
        .any(|rest| rest.split_whitespace().nth(1) == Some("value:"))
}

// --- schema version ---------------------------------------------------------

/// Why the schema check or migration refused.
#[derive(Debug)]
enum Refusal {
    Db(diesel::result::Error),
    Newer(i64),
    Foreign,
    NoSettle,
    Migration(String),
}

impl From<diesel::result::Error> for Refusal {
    fn from(e: diesel::result::Error) -> Self {
        Refusal::Db(e)
    }
}

impl Refusal {
    fn into_open(self, path: &Path, location: &str) -> OpenError {
        match self {
            Refusal::Db(e) => sqlite_refusal(path, "reading the schema", e.to_string()),
            other => other.into_open_pg(location),
        }
    }

    fn into_open_pg(self, location: &str) -> OpenError {
        match self {
            Refusal::Db(e) => OpenError::Database {
                location: location.to_owned(),
                context: "reading the schema",
                message: e.to_string(),
            },
            Refusal::Newer(found) => OpenError::NewerSchema {
                location: location.to_owned(),
                found,
                supported: SCHEMA_VERSION,
            },
            Refusal::Foreign => OpenError::ForeignDatabase {
                path: PathBuf::from(location),
            },
            Refusal::NoSettle => OpenError::NoSettleDatabase {
                path: PathBuf::from(location),
            },
            Refusal::Migration(message) => OpenError::Migration {
                location: location.to_owned(),
                message,
            },
        }
    }
}

#[derive(QueryableByName)]
struct TableName {
    #[diesel(sql_type = Text)]
    name: String,
}

/// Read-only: refuse a database of a newer schema version, (for SQLite,
/// where a file is one program's) one that holds another program's tables,
/// and with `require_settle` one without the store's tables (on PostgreSQL,
/// where a database may be shared, whatever else it holds).
fn check_schema(db: Db<'_>, refuse_foreign: bool, require_settle: bool) -> Result<Schema, Refusal> {
    on_db!(db, |c| {
        let sql = if refuse_foreign {
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
        } else {
            "SELECT table_name::text AS name FROM information_schema.tables \
             WHERE table_schema = current_schema()"
        };
        let tables: Vec<TableName> = diesel::sql_query(sql).load(c)?;
        if tables.is_empty() {
            return if require_settle {
                Err(Refusal::NoSettle)
            } else {
                Ok(Schema::ToBring(0))
            };
        }
        if !tables.iter().any(|t| t.name == "settle_meta") {
            return if refuse_foreign {
                Err(Refusal::Foreign)
            } else if require_settle {
                Err(Refusal::NoSettle)
            } else {
                Ok(Schema::ToBring(0))
            };
        }
        let version: Option<i64> = settle_meta::table
            .find(SCHEMA_VERSION_KEY)
            .select(settle_meta::value)
            .first(c)
            .optional()?;
        match version {
            Some(v) if v > SCHEMA_VERSION => Err(Refusal::Newer(v)),
            Some(SCHEMA_VERSION) => Ok(Schema::Current),
            found => Ok(Schema::ToBring(found.unwrap_or(0))),
        }
    })
}

/// What [`check_schema`] found of a database it did not refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Schema {
    /// This build's schema, every migration applied (each one sets the
    /// version).
    Current,
    /// None yet (0), or an older one: the migrations bring it up to date.
    ToBring(i64),
}
