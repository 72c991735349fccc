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
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use diesel::connection::SimpleConnection;
use diesel::pg::PgConnection;
use diesel::Connection;

/// Which database a test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A fresh, empty database for one test.
pub struct TestDb {
    pub url: String,
    pub backend: Backend,
    dir: Option<tempfile::TempDir>,
    pg: Option<(String, String)>,
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
                })
            }
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
        match self.backend {
            Backend::Sqlite => diesel::sqlite::SqliteConnection::establish(&self.url)
                .expect("connect")
                .batch_execute(sql)
                .expect("execute"),
            Backend::Postgres => PgConnection::establish(&self.url)
                .expect("connect")
                .batch_execute(sql)
                .expect("execute"),
        }
    }
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
    start_cluster()
}

fn pg_bin_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|d| d.join("initdb").exists() && d.join("pg_ctl").exists())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    if let Some(d) = dirs.pop() {
        return Some(d);
    }
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    let d = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    d.join("initdb").exists().then_some(d)
}

fn is_root() -> bool {
    fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn uid_of(user: &str) -> Option<(u32, u32)> {
    let passwd = fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        (f.first() == Some(&user))
            .then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// A command run as the cluster's owner: `postgres` when we are root.
fn as_owner(program: &Path) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program);
        c
    } else {
        Command::new(program)
    }
}

fn start_cluster() -> Result<String, String> {
    let bin = pg_bin_dir().ok_or("no PostgreSQL server binaries (initdb, pg_ctl) were found")?;
    let dir = tempfile::Builder::new()
        .prefix("settle-store-pg-")
        .tempdir()
        .map_err(|e| format!("cannot make a folder for the cluster: {e}"))?
        .keep();
    if is_root() {
        let (uid, gid) = uid_of("postgres")
            .ok_or("running as root, and there is no `postgres` user to own a cluster")?;
        std::os::unix::fs::chown(&dir, Some(uid), Some(gid))
            .map_err(|e| format!("cannot hand the cluster folder to postgres: {e}"))?;
    }
    let data = dir.join("data");
    let status = as_owner(&bin.join("initdb"))
        .arg("-D")
        .arg(&data)
        .args(["-A", "trust", "-U", "postgres", "--no-sync", "-E", "UTF8"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run initdb: {e}"))?;
    if !status.success() {
        return Err(format!("initdb failed ({status})"));
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("no free port: {e}"))?
        .port();
    let options = format!(
        "-c listen_addresses=127.0.0.1 -p {port} -k {} -c max_connections=300 -c fsync=off -c full_page_writes=off",
        dir.display()
    );
    let status = as_owner(&bin.join("pg_ctl"))
        .arg("-D")
        .arg(&data)
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "-o", &options, "start"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run pg_ctl: {e}"))?;
    if !status.success() {
        let log = fs::read_to_string(dir.join("log")).unwrap_or_default();
        return Err(format!("pg_ctl start failed ({status}): {log}"));
    }
    // Stop the cluster and remove it once this test binary has exited.
    let watchdog = format!(
        "while kill -0 {pid} 2>/dev/null; do sleep 0.5; done; \
         kill -QUIT $(head -n 1 '{data}/postmaster.pid') 2>/dev/null; sleep 1; rm -rf '{dir}'",
        pid = std::process::id(),
        data = data.display(),
        dir = dir.display(),
    );
    Command::new("sh")
        .args(["-c", &watchdog])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the cluster's watchdog: {e}"))?;
    Ok(format!("postgres://postgres@127.0.0.1:{port}/postgres"))
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
