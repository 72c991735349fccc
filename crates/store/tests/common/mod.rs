//! The test harness: one database per test, on either backend.
//!
//! PostgreSQL comes from `SETTLE_TEST_PG_URL` (an admin URL on a server where
//! the tests may create databases), or else from a throwaway cluster that this
//! test binary starts once with `initdb`/`pg_ctl` (as the `postgres` user when
//! running as root) and that a watchdog stops when the binary exits. When
//! neither is possible the PostgreSQL tests say loudly that they are skipped,
//! and fail instead when `CI=true`.

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

#[path = "../support/pg_cluster.rs"]
mod pg_cluster;

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::Connection;
use settle_store::{MemoryStore, SessionStore, Store, StoreOptions};

/// Which store a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
    /// `MemoryStore`: no database, so no URL; its clones share the data.
    Memory,
}

/// A fresh, empty database (or memory store) for one test.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
    memory: Option<MemoryStore>,
}

static NEXT_DB: AtomicUsize = AtomicUsize::new(0);

impl TestDb {
    /// A new database, or `None` when PostgreSQL is unavailable here (the
    /// caller then returns: the test is skipped, loudly).
    pub fn new(backend: Backend) -> Option<TestDb> {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("a temporary folder");
                let url = dir
                    .path()
                    .join("settle.db")
                    .to_str()
                    .expect("a UTF-8 temporary path")
                    .to_owned();
                Some(TestDb {
                    url,
                    backend,
                    dir: Some(dir),
                    pg: None,
                    memory: None,
                })
            }
            Backend::Postgres => {
                let admin = pg_admin_url()?;
                let name = format!(
                    "settle_test_{}_{}",
                    std::process::id(),
                    NEXT_DB.fetch_add(1, Ordering::SeqCst)
                );
                let mut conn = PgConnection::establish(&admin).expect("connect as admin");
                conn.batch_execute(&format!("CREATE DATABASE \"{name}\""))
                    .expect("create a test database");
                Some(TestDb {
                    url: with_database(&admin, &name),
                    backend,
                    dir: None,
                    pg: Some((admin, name)),
                    memory: None,
                })
            }
            Backend::Memory => Some(TestDb {
                url: String::new(),
                backend,
                dir: None,
                pg: None,
                memory: Some(MemoryStore::new()),
            }),
        }
    }

    /// A store on this database: another handle on the same data each time
    /// (a new `Store`, or a clone of the `MemoryStore`).
    pub fn open(&self) -> Arc<dyn SessionStore> {
        match &self.memory {
            Some(memory) => Arc::new(memory.clone()),
            None => Arc::new(Store::open(&self.url).expect("open the test store")),
        }
    }

    /// A store on this database with `options` (which `MemoryStore` has no use for).
    pub fn open_with(&self, options: StoreOptions) -> Arc<dyn SessionStore> {
        match &self.memory {
            Some(memory) => Arc::new(memory.clone()),
            None => Arc::new(Store::open_with(&self.url, options).expect("open the test store")),
        }
    }

    /// The SQLite file's path.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(&self.url)
    }

    /// The folder of the SQLite file.
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().expect("an SQLite test database").path()
    }

    /// Run SQL directly on the database, outside the store.
    pub fn execute(&self, sql: &str) {
        self.script(sql).expect("execute");
    }

    /// A connection of its own to the SQLite file, outside the store. It
    /// waits out a lock as the store's own connections do: the store's
    /// checkpointer may hold one for a moment at any time, and a machine
    /// under load makes that moment long.
    fn sqlite(&self) -> diesel::sqlite::SqliteConnection {
        let mut conn = diesel::sqlite::SqliteConnection::establish(&self.url).expect("connect");
        conn.batch_execute("PRAGMA busy_timeout = 10000;")
            .expect("busy timeout");
        conn
    }

    /// `sql` on a connection of its own, outside the store.
    fn script(&self, sql: &str) -> diesel::QueryResult<()> {
        match self.backend {
            Backend::Sqlite => self.sqlite().batch_execute(sql),
            Backend::Postgres => PgConnection::establish(&self.url)
                .expect("connect")
                .batch_execute(sql),
            Backend::Memory => panic!("a MemoryStore has no SQL"),
        }
    }
}

impl TestDb {
    /// Run SQL directly on the database, outside the store, in a transaction
    /// that is rolled back: whether every statement was accepted, or the
    /// database's error.
    pub fn try_and_roll_back(&self, sql: &str) -> Result<(), String> {
        // A refused statement leaves the transaction open on a connection
        // that is dropped at once, which rolls it back.
        self.script(&format!("BEGIN; {sql}; ROLLBACK;"))
            .map_err(|e| e.to_string())
    }

    /// The opcodes of the program SQLite compiles for `explain` (an
    /// `EXPLAIN …` statement), in order.
    pub fn opcodes(&self, explain: &str) -> Vec<String> {
        use diesel::RunQueryDsl;
        assert_eq!(self.backend, Backend::Sqlite, "an SQLite program");
        let rows: Vec<Opcode> = diesel::sql_query(explain)
            .load(&mut self.sqlite())
            .expect("explain");
        rows.into_iter().map(|r| r.opcode).collect()
    }
}

#[derive(diesel::QueryableByName)]
struct Opcode {
    #[diesel(sql_type = diesel::sql_types::Text)]
    opcode: String,
}

impl Drop for TestDb {
    fn drop(&mut self) {
        if let Some((admin, name)) = &self.pg {
            if let Ok(mut conn) = PgConnection::establish(admin) {
                let _ =
                    conn.batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"));
            }
        }
    }
}

/// `admin` with its database replaced by `name`.
pub fn with_database(admin: &str, name: &str) -> String {
    let (scheme, rest) = admin.split_once("://").expect("a URL");
    let (rest, query) = match rest.split_once('?') {
        Some((r, q)) => (r, format!("?{q}")),
        None => (rest, String::new()),
    };
    let authority = rest.split('/').next().unwrap_or(rest);
    format!("{scheme}://{authority}/{name}{query}")
}

/// The admin URL of a PostgreSQL server for this test binary, or `None` (after
/// saying so loudly) when there is none; panics instead under `CI=true`.
pub fn pg_admin_url() -> Option<String> {
    static SERVER: OnceLock<Result<String, String>> = OnceLock::new();
    match SERVER.get_or_init(find_or_start_server) {
        Ok(url) => Some(url.clone()),
        Err(reason) => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("PostgreSQL is required under CI=true but unavailable: {reason}");
            }
            eprintln!(
                "\n**************** SKIPPED: PostgreSQL test ****************\n\
                 {reason}\n\
                 Set SETTLE_TEST_PG_URL or install PostgreSQL (initdb, pg_ctl).\n\
                 **********************************************************\n"
            );
            None
        }
    }
}

fn find_or_start_server() -> Result<String, String> {
    if let Ok(url) = std::env::var("SETTLE_TEST_PG_URL") {
        if !url.is_empty() {
            return Ok(url);
        }
    }
    pg_cluster::start_cluster("settle-store-pg-").map(|c| c.admin_url)
}

/// A runtime for one test.
pub fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The environment variable that makes this test binary act as a child.
pub const ROLE: &str = "SETTLE_STORE_TEST_ROLE";

/// This test binary, re-run as a child acting out `role`.
pub fn child(role: &str) -> Command {
    let mut c = Command::new(std::env::current_exe().expect("the test binary"));
    c.args([
        "child_process",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ])
    .env(ROLE, role)
    .env_remove("RUST_TEST_THREADS");
    c
}

/// The bytes of every file in `dir`, by name: a snapshot to compare.
pub fn snapshot(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(dir)
        .expect("read the folder")
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let bytes = if e.path().is_file() {
                fs::read(e.path()).unwrap_or_default()
            } else {
                b"<dir>".to_vec()
            };
            (name, bytes)
        })
        .collect();
    files.sort();
    files
}

#[derive(diesel::QueryableByName)]
struct One {
    #[diesel(sql_type = diesel::sql_types::BigInt)]
    value: i64,
}

impl TestDb {
    /// Run a query that returns one `BIGINT` column named `value`, outside the store.
    pub fn query_i64(&self, sql: &str) -> i64 {
        use diesel::RunQueryDsl;
        let row: One = match self.backend {
            Backend::Sqlite => diesel::sql_query(sql)
                .get_result(&mut self.sqlite())
                .expect("query"),
            Backend::Postgres => diesel::sql_query(sql)
                .get_result(&mut PgConnection::establish(&self.url).expect("connect"))
                .expect("query"),
            Backend::Memory => panic!("a MemoryStore has no SQL"),
        };
        row.value
    }
}
