//! Opening a store: the schema, and bad locations refused whole (G11).

use crate::common::{self, rt, Backend, TestDb};
use crate::{open, session};
use settle_store::{NewSession, OpenError, Store, StoreError};
use std::time::Duration;

// --- open, schema -----------------------------------------------------------

pub(crate) fn schema_is_created_on_first_use_and_kept(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let id = rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "kept").await;
        id
    });
    if b == Backend::Sqlite {
        assert!(db.path().exists());
    }
    // Opening again runs no migration twice and finds the session.
    let store = open(&db);
    let rows = rt().block_on(store.list_sessions(None)).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].id, id);
    assert_eq!(rows[0].name, "kept");
}

pub(crate) fn g11_newer_schema_is_refused_and_left_alone(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    drop(open(&db));
    db.execute("UPDATE settle_meta SET value = 99 WHERE key = 'schema_version'");
    let before = (b == Backend::Sqlite).then(|| common::snapshot(db.dir()));
    let err = Store::open(&db.url).unwrap_err();
    assert!(
        matches!(
            err,
            OpenError::NewerSchema {
                found: 99,
                supported: 1,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("upgrade settle"), "{msg}");
    if let Some(before) = before {
        assert_eq!(common::snapshot(db.dir()), before, "the file was modified");
        assert!(msg.contains(&db.url), "{msg}");
    }
}

// --- open: SQLite locations (G11) ------------------------------------------------------

pub(crate) fn assert_refused_untouched(
    dir: &std::path::Path,
    url: &str,
    check: impl Fn(&OpenError) -> bool,
) -> OpenError {
    let before = common::snapshot(dir);
    let err = Store::open(url).unwrap_err();
    assert!(check(&err), "{err:?}");
    assert_eq!(common::snapshot(dir), before, "open wrote something: {err}");
    err
}

#[test]
pub(crate) fn g11_open_refuses_a_missing_folder() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing").join("settle.db");
    let err = assert_refused_untouched(dir.path(), path.to_str().unwrap(), |e| {
        matches!(e, OpenError::MissingFolder { .. })
    });
    assert!(!path.parent().unwrap().exists());
    let msg = err.to_string();
    assert!(
        msg.contains(path.to_str().unwrap()) && msg.contains("create the folder"),
        "{msg}"
    );
}

#[test]
pub(crate) fn g11_open_refuses_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("db")).unwrap();
    let path = dir.path().join("db");
    let err = assert_refused_untouched(dir.path(), path.to_str().unwrap(), |e| {
        matches!(e, OpenError::IsDirectory { .. })
    });
    assert!(err.to_string().contains("is a directory"), "{err}");
    assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
}

#[test]
pub(crate) fn g11_open_refuses_a_file_that_is_not_a_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.txt");
    std::fs::write(&path, "these are my notes, not a database\n".repeat(10)).unwrap();
    let err = assert_refused_untouched(dir.path(), path.to_str().unwrap(), |e| {
        matches!(e, OpenError::NotADatabase { .. })
    });
    assert!(err.to_string().contains("left untouched"), "{err}");
    // Shorter than a header, too.
    std::fs::write(&path, "x").unwrap();
    assert_refused_untouched(dir.path(), path.to_str().unwrap(), |e| {
        matches!(e, OpenError::NotADatabase { .. })
    });
}

#[test]
pub(crate) fn g11_open_refuses_a_corrupt_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("settle.db");
    let url = path.to_str().unwrap();
    rt().block_on(async {
        let store = Store::open(url).unwrap();
        session(&store, "s").await;
    });
    // Keep SQLite's header, wreck the schema page behind it.
    let mut bytes = std::fs::read(&path).unwrap();
    assert!(bytes.len() > 4096);
    for b in &mut bytes[100..1024] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let err = assert_refused_untouched(dir.path(), url, |e| matches!(e, OpenError::Corrupt { .. }));
    assert!(err.to_string().contains("backup"), "{err}");
}

#[test]
pub(crate) fn g11_open_refuses_another_programs_database() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("theirs.db");
    let url = path.to_str().unwrap();
    {
        use diesel::connection::SimpleConnection;
        use diesel::Connection;
        let mut c = diesel::sqlite::SqliteConnection::establish(url).unwrap();
        c.batch_execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER)")
            .unwrap();
    }
    assert_refused_untouched(dir.path(), url, |e| {
        matches!(e, OpenError::ForeignDatabase { .. })
    });
}

/// A read-only location: a folder this process may not write to. Root may
/// write anywhere, so as root the check runs in a child as `nobody`.
#[test]
pub(crate) fn g11_open_refuses_a_read_only_location() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let ro = dir.path().join("ro");
    std::fs::create_dir(&ro).unwrap();
    // An existing database in it, too: WAL needs to write beside it.
    let existing = ro.join("existing.db");
    drop(Store::open(existing.to_str().unwrap()).unwrap());
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let before = common::snapshot(&ro);
    let is_root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    let out = if is_root {
        // `nobody` may not be able to reach the build folder: run a copy of
        // this test binary from the (world-readable) temporary folder.
        let exe = dir.path().join("store-test-binary");
        std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
        let probe = std::process::Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(&exe)
            .arg("--list")
            .output();
        if !probe.is_ok_and(|o| o.status.success()) {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("cannot run the read-only check as `nobody` under CI");
            }
            eprintln!(
                "\n*** SKIPPED: read-only location check (root, and no way to run as nobody) ***\n"
            );
            return;
        }
        std::process::Command::new("runuser")
            .args(["-u", "nobody", "--"])
            .arg(&exe)
            .args([
                "child_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(common::ROLE, "read_only")
            .env("SETTLE_STORE_TEST_DIR", &ro)
            .output()
            .unwrap()
    } else {
        common::child("read_only")
            .env("SETTLE_STORE_TEST_DIR", &ro)
            .output()
            .unwrap()
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("REFUSED new ReadOnly"), "{stdout}");
    assert!(stdout.contains("REFUSED existing ReadOnly"), "{stdout}");
    assert_eq!(
        common::snapshot(&ro),
        before,
        "open wrote in a read-only folder"
    );
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o755)).unwrap();
}

pub(crate) fn child_read_only() {
    let dir = std::path::PathBuf::from(std::env::var("SETTLE_STORE_TEST_DIR").unwrap());
    for (label, name) in [("new", "new.db"), ("existing", "existing.db")] {
        let path = dir.join(name);
        match Store::open(path.to_str().unwrap()) {
            Err(OpenError::ReadOnly { .. }) => println!("REFUSED {label} ReadOnly"),
            Err(other) => println!("REFUSED {label} {other:?}"),
            Ok(_) => println!("OPENED {label}"),
        }
    }
}

// --- open: PostgreSQL URLs ----------------------------------------------------------------

#[test]
pub(crate) fn g11_open_refuses_an_unreachable_server() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://settle:hunter2@127.0.0.1:{port}/settle");
    let err = Store::open(&url).unwrap_err();
    assert!(matches!(err, OpenError::Unreachable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("127.0.0.1:{port}")), "{msg}");
    assert!(!msg.contains("hunter2"), "the password leaked: {msg}");
}

/// Built without `postgres-tls`, a URL that requires TLS is refused before
/// any connection is tried, naming the feature that would allow it.
#[cfg(not(feature = "postgres-tls"))]
#[test]
pub(crate) fn g11_open_refuses_tls_when_built_without_it() {
    let url = "postgres://settle:hunter2@127.0.0.1:1/settle?sslmode=require";
    let err = Store::open(url).unwrap_err();
    assert!(matches!(err, OpenError::TlsNotBuilt { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("postgres-tls"), "{msg}");
    assert!(!msg.contains("hunter2"), "the password leaked: {msg}");
}

#[test]
pub(crate) fn g11_open_refuses_a_missing_postgres_database() {
    let Some(admin) = common::pg_admin_url() else {
        return;
    };
    let url = common::with_database(&admin, "settle_no_such_database");
    let err = Store::open(&url).unwrap_err();
    assert!(matches!(err, OpenError::MissingDatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("createdb"), "{err}");
}

/// The server drops the store's connections (a restart, an administrator):
/// the write in flight fails, later ones go through on a new connection.
#[test]
pub(crate) fn postgres_writer_reconnects_after_losing_its_connection() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let store = open(&db);
    rt().block_on(async {
        let (o, _) = session(&*store, "before").await;
        db.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut attempts = 0;
        let id = loop {
            attempts += 1;
            match store.create_session(NewSession::new("after", o)).await {
                Ok(id) => break id,
                Err(StoreError::Database { .. }) if attempts < 3 => continue,
                Err(e) => panic!("the writer did not recover: {e:?}"),
            }
        };
        assert_eq!(
            attempts, 2,
            "the first write should meet the dead connection"
        );
        let rows = store.list_sessions(None).await.unwrap();
        assert_eq!(rows.last().unwrap().id, id);
    });
}
