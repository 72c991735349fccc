//! Opening a store: the schema, and bad locations refused whole (G11).

use std::time::{Duration, UNIX_EPOCH};

use serde_json::json;
use settle_store::{
    ChunkKind, EndReason, FinalizeRequest, HostIdentity, NewChunk, NewSession, OpenError, Outcome,
    RecoverOptions, SessionFilter, SessionId, SessionStore, State, Store, StoreError, StoreOptions,
    TurnError, TurnErrorKind, TurnInput,
};

use crate::common::{self, rt, Backend, TestDb};
use crate::{now, open, session, write};

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
    let rows = rt()
        .block_on(store.list_sessions(SessionFilter::all().oldest_first()))
        .unwrap();
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
                supported: 2..=98,
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

/// A store opened to read only ([`StoreOptions::read_only`]) beside a
/// writer that has it open: it reads what the writer committed, and after;
/// a write through it fails as a store error and changes nothing; a store
/// of an older schema is refused rather than brought up to date.
pub(crate) fn a_store_opened_to_read_reads_beside_its_writer_and_writes_nothing(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let writer = open(&db);
        let (_, first) = session(&*writer, "first").await;
        let reader = Store::open_with(&db.url, StoreOptions::default().with_read_only(true))
            .expect("open to read");
        let rows = reader.list_sessions(SessionFilter::all()).await.unwrap();
        assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [first]);
        // What the writer commits later is read too.
        let (_, second) = session(&*writer, "second").await;
        let rows = reader
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap();
        assert_eq!(
            rows.iter().map(|r| r.id).collect::<Vec<_>>(),
            [first, second]
        );
        let (owner, _) = session(&*writer, "owner's").await;
        let refused = write::register(&reader, NewSession::new("never", owner)).await;
        assert!(refused.is_err(), "a write through a reader: {refused:?}");
        let rows = writer.list_sessions(SessionFilter::all()).await.unwrap();
        assert_eq!(rows.len(), 3, "nothing written through the reader");
    });
    db.execute("UPDATE settle_meta SET value = 1 WHERE key = 'schema_version'");
    let err = Store::open_with(&db.url, StoreOptions::default().with_read_only(true)).unwrap_err();
    assert!(
        matches!(err, OpenError::OlderSchema { found: 1, .. }),
        "{err:?}"
    );
    let version: i64 = db.query_i64("SELECT value FROM settle_meta WHERE key = 'schema_version'");
    assert_eq!(version, 1, "not brought up to date by a reader");
}

/// A role that may only read a PostgreSQL store opens it, to read or
/// not: a schema already current takes no migration lock and writes
/// nothing (the migration's `CREATE TABLE IF NOT EXISTS` alone needs the
/// right to create).
#[test]
fn a_postgres_role_that_may_only_read_opens_a_current_store() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let id = rt().block_on(async { session(&*open(&db), "kept").await.1 });
    let role = format!("settle_reader_{}", std::process::id());
    db.execute(&format!(
        "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN PASSWORD 'reader'; \
         GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role}"
    ));
    let (scheme, rest) = db.url.split_once("://").unwrap();
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    let url = format!("{scheme}://{role}:reader@{host}");
    for options in [
        StoreOptions::default().with_existing_only(true),
        StoreOptions::default().with_read_only(true),
    ] {
        let store = Store::open_with(&url, options).expect("a reader opens a current store");
        let rows = rt()
            .block_on(store.list_sessions(SessionFilter::all()))
            .unwrap();
        assert_eq!(rows.iter().map(|r| r.id).collect::<Vec<_>>(), [id]);
    }
    // The role outlives the database: dropped once the database is gone.
    drop(db);
    if let Some(admin) = common::pg_admin_url() {
        use diesel::connection::SimpleConnection as _;
        use diesel::Connection as _;
        let mut conn = diesel::PgConnection::establish(&admin).unwrap();
        conn.batch_execute(&format!("DROP ROLE IF EXISTS {role}"))
            .unwrap();
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

/// A database the store creates, and the log and index SQLite keeps
/// beside it, are its owner's only: transcripts hold what users typed. A
/// file that was there keeps the mode it had.
#[test]
pub(crate) fn a_new_database_and_its_companions_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("settle.db");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    rt().block_on(async {
        let store = Store::open(path.to_str().unwrap()).unwrap();
        let (_, id) = session(&store, "private").await;
        // Still open: the log and its index are there.
        assert_eq!(store.session_detail(id).await.unwrap().session.id, id);
        for suffix in ["", "-wal", "-shm"] {
            let file = dir.path().join(format!("settle.db{suffix}"));
            assert_eq!(mode(&file), 0o600, "{}", file.display());
        }
    });
    let shared = dir.path().join("shared.db");
    std::fs::File::create(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o644)).unwrap();
    drop(Store::open(shared.to_str().unwrap()).unwrap());
    assert_eq!(mode(&shared), 0o644);
}

#[test]
pub(crate) fn g11_open_refuses_an_empty_path() {
    // SQLite takes an empty file name for a temporary database of its own,
    // a different one per connection, gone on close: an empty variable
    // would have run a whole program into nothing, then failed its reads.
    let dir = tempfile::tempdir().unwrap();
    for url in ["", "sqlite://", "sqlite:"] {
        let err = assert_refused_untouched(dir.path(), url, |e| matches!(e, OpenError::EmptyPath));
        assert!(err.to_string().contains("path is empty"), "{err}");
    }
}

/// Locations meant for another kind of store are refused before SQLite
/// would make a file of their name: libpq's keyword string (without
/// repeating it: it may hold a password), a URL of another scheme, and
/// `postgres:` without its `//`. A URL's scheme is read in any case, and
/// a file name with a colon in it is still a path.
#[test]
pub(crate) fn g11_a_location_meant_for_another_store_is_refused_and_names_no_password() {
    let conn_string = "host=127.0.0.1 port=5432 password=KEYWORDPW dbname=x";
    let err = Store::open(conn_string).unwrap_err();
    assert!(matches!(err, OpenError::ConnString), "{err:?}");
    assert!(!err.to_string().contains("KEYWORDPW"), "{err}");
    assert!(!std::path::Path::new(conn_string).exists());
    for (url, says) in [
        ("mysql://u:MYSQLPW@h/db", "mysql://u:***@h/db"),
        ("http://x/settle.db", "http://x/settle.db"),
        ("postgres:u:NOSLASHPW@h/db", "postgres:…"),
        ("PostgreSQL:x", "PostgreSQL:…"),
    ] {
        let err = Store::check_location(url).unwrap_err();
        assert!(matches!(err, OpenError::NotAPath { .. }), "{url}: {err:?}");
        let msg = err.to_string();
        assert!(
            msg.starts_with(says) && !msg.contains("PW@"),
            "{url}: {msg}"
        );
        assert!(Store::open(url).is_err());
        assert!(!std::path::Path::new(url).exists(), "{url} made a file");
    }
    for conn in [
        "host = h password = P",
        "keepalives=1 host=h",
        "sslpassword=P",
    ] {
        assert!(
            matches!(Store::check_location(conn), Err(OpenError::ConnString)),
            "{conn}"
        );
    }
    for url in [
        " postgres://u:PW@h/d",
        "\"postgres://u:PW@h/d\"",
        "<http://u:PW@h>",
    ] {
        let err = Store::check_location(url).unwrap_err();
        assert!(!err.to_string().contains("PW@"), "{url}: {err}");
    }
    for path in [
        "backup:2024.db",
        "./a:b.db",
        "sqlite://x.db",
        "settle.db",
        "x=1.db",
        "mode=ro.db",
    ] {
        assert!(Store::check_location(path).is_ok(), "{path}");
    }
    assert!(Store::check_location("POSTGRES://u@h/db").is_ok());
    // The SQLite prefix is read in any case too.
    for url in ["SQLITE:x.db", "SQLite://x.db", "sqlite:x.db"] {
        assert_eq!(Store::sqlite_file(url), Some("x.db".into()), "{url}");
    }
    assert_eq!(Store::sqlite_file("POSTGRES://u@h/db"), None);
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

/// Opened for an existing store only, an empty file and an SQLite database
/// without tables are refused and left as they were; opened as usual, the
/// same file becomes a store.
#[test]
pub(crate) fn g11_open_existing_only_refuses_a_file_without_a_store_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").unwrap();
    let url = path.to_str().unwrap();
    let existing = StoreOptions::default().with_existing_only(true);
    let before = common::snapshot(dir.path());
    let err = Store::open_with(url, existing.clone()).unwrap_err();
    assert!(matches!(err, OpenError::NoSettleDatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("empty.db"), "{err}");
    assert_eq!(common::snapshot(dir.path()), before, "open wrote something");
    // A store made in it is then opened, existing only or not.
    drop(Store::open(url).unwrap());
    drop(Store::open_with(url, existing).unwrap());
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
    // Made for its owner only: shared for reading, as a service's may be.
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o644)).unwrap();
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

/// A URL libpq cannot read is `BadUrl` (bad input), and neither the error
/// nor what libpq quotes back in it shows the password.
#[test]
pub(crate) fn g11_open_refuses_a_malformed_url_without_showing_its_password() {
    for url in [
        "postgres://postgres:hunter2@[::1/settle",
        "postgres://settle:hunter2@127.0.0.1:notaport/settle",
        "postgres://settle:hunter2@127.0.0.1/settle?sslmode=bogus",
        "postgres://settle@127.0.0.1/settle?password=hunter2&nosuchoption=1",
    ] {
        let err = Store::open(url).unwrap_err();
        assert!(matches!(err, OpenError::BadUrl { .. }), "{url}: {err:?}");
        let msg = err.to_string();
        assert!(!msg.contains("hunter2"), "the password leaked: {msg}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }
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

/// Opened for an existing store only, a PostgreSQL database without the
/// store's tables (an empty one, or one that holds another program's) is
/// refused and nothing is created in it; opened as usual, it becomes a store.
#[test]
pub(crate) fn g11_open_existing_only_refuses_a_postgres_database_without_a_store_and_writes_nothing(
) {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    db.execute("CREATE TABLE their_table (x INTEGER)");
    let tables = || -> Vec<String> {
        use diesel::prelude::*;
        #[derive(QueryableByName)]
        struct Name {
            #[diesel(sql_type = diesel::sql_types::Text)]
            name: String,
        }
        let mut conn = diesel::pg::PgConnection::establish(&db.url).unwrap();
        let mut names: Vec<String> = diesel::sql_query(
            "SELECT table_name::text AS name FROM information_schema.tables \
             WHERE table_schema = current_schema()",
        )
        .load::<Name>(&mut conn)
        .unwrap()
        .into_iter()
        .map(|n| n.name)
        .collect();
        names.sort();
        names
    };
    let existing = StoreOptions::default().with_existing_only(true);
    let err = Store::open_with(&db.url, existing.clone()).unwrap_err();
    assert!(matches!(err, OpenError::NoSettleDatabase { .. }), "{err:?}");
    assert_eq!(tables(), ["their_table"], "a read-only open created tables");
    drop(Store::open(&db.url).unwrap());
    drop(Store::open_with(&db.url, existing).unwrap());
    assert!(tables().contains(&"settle_meta".to_owned()));
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
            match write::register(&*store, NewSession::new("after", o)).await {
                Ok(id) => break id,
                Err(StoreError::Database { .. }) if attempts < 3 => continue,
                Err(e) => panic!("the writer did not recover: {e:?}"),
            }
        };
        assert_eq!(
            attempts, 2,
            "the first write should meet the dead connection"
        );
        let rows = store
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap();
        assert_eq!(rows.last().unwrap().id, id);
    });
}

/// The lifecycle's words are the only states a row may hold, and on SQLite
/// the check is a few comparisons: an `IN` list of five words made SQLite
/// build a temporary table for every row a write inserted or moved, about
/// half of what updating a session's row cost.
pub(crate) fn the_state_check_refuses_other_words_without_a_temporary_table(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        session(&*store, "checked").await;
    });
    state_check_holds(&db, b);
}

/// The checks of [`the_state_check_refuses_other_words_without_a_temporary_table`]
/// on `db`, wherever its schema came from.
fn state_check_holds(db: &TestDb, b: Backend) {
    let refused = db.try_and_roll_back("UPDATE sessions SET state = 'paused'");
    assert!(
        refused
            .as_ref()
            .is_err_and(|e| e.to_lowercase().contains("check")),
        "a word outside the lifecycle is refused: {refused:?}"
    );
    for state in State::ALL {
        let word = state.as_str();
        let kept = db.try_and_roll_back(&format!("UPDATE sessions SET state = '{word}'"));
        assert!(kept.is_ok(), "{word}: {kept:?}");
    }
    if b == Backend::Sqlite {
        let program = db.opcodes("EXPLAIN UPDATE sessions SET state = 'settled' WHERE id = 1");
        assert!(program.iter().any(|op| op == "Halt"), "{program:?}");
        assert!(
            !program.iter().any(|op| op == "OpenEphemeral"),
            "the state check builds a temporary table: {program:?}"
        );
    }
}

/// A database written by the first schema, with data in every table, is
/// brought up to date in place when opened: the data is intact, and the new
/// columns work on old rows and new ones alike.
pub(crate) fn an_old_database_upgrades_in_place(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let (init, sequences) = match b {
        Backend::Sqlite => (
            include_str!("../../migrations/sqlite/2025-01-01-000000_init/up.sql"),
            "",
        ),
        Backend::Postgres => (
            include_str!("../../migrations/postgres/2025-01-01-000000_init/up.sql"),
            "SELECT setval('owners_id_seq', 1); SELECT setval('sessions_id_seq', 2); \
             SELECT setval('timeline_id_seq', 5); SELECT setval('memories_id_seq', 1);",
        ),
        Backend::Memory => unreachable!("a database test"),
    };
    // As the first release left it: its migration recorded, its rows written.
    db.execute(
        "CREATE TABLE __diesel_schema_migrations (\
           version VARCHAR(50) PRIMARY KEY NOT NULL, \
           run_on TIMESTAMP NOT NULL DEFAULT CURRENT_TIMESTAMP);\
         INSERT INTO __diesel_schema_migrations (version) VALUES ('20250101000000');",
    );
    db.execute(init);
    db.execute(
        "INSERT INTO owners (id, host, pid, started_at, lease_expires_at) \
           VALUES (1, 'old-host', 4000002, 1700000000000, 4102444800000);\
         INSERT INTO sessions (id, name, parent, tree, state, outcome, end_reason, \
           closing_reason, open_turn, created_at, finalized_at, finalize_errors, version, owner) \
           VALUES (1, 'root', NULL, 1, 'finalized', 'completed', 'completed', NULL, NULL, \
                   1700000000000, 1700000005000, NULL, 6, 1), \
                  (2, 'kid', 1, 1, 'running', 'failed', NULL, NULL, 2, \
                   1700000001000, NULL, NULL, 4, 1);\
         INSERT INTO turns (session, \"no\", outcome, started_at, ended_at, next_seq) \
           VALUES (1, 1, 'completed', 1700000000100, 1700000000900, 2), \
                  (2, 1, 'failed', 1700000001100, 1700000001200, 1), \
                  (2, 2, NULL, 1700000001300, NULL, 1);\
         INSERT INTO chunks (session, turn_no, seq, \"text\") \
           VALUES (1, 1, 0, 'hello '), (1, 1, 1, 'world'), (2, 1, 0, 'x'), (2, 2, 0, 'open');\
         INSERT INTO timeline (id, session, at, from_state, to_state, cause) \
           VALUES (1, 1, 1700000000000, NULL, 'registered', 'registered'), \
                  (2, 2, 1700000001000, NULL, 'registered', 'registered'), \
                  (3, 2, 1700000001300, 'registered', 'running', 'turn started'), \
                  (4, 1, 1700000004000, 'registered', 'settled', 'agent finished'), \
                  (5, 1, 1700000005000, 'settled', 'finalized', 'finalize: completed');\
         INSERT INTO memories (id, session, turn_no, content, created_at) \
           VALUES (1, 1, 1, 'hello world', 1700000005000);",
    );
    db.execute(sequences);

    let store = Store::open(&db.url).expect("the old database opens and upgrades");
    assert_eq!(
        db.query_i64("SELECT value FROM settle_meta WHERE key = 'schema_version'"),
        9
    );
    state_check_holds(&db, b);
    // Rows written before keep every segment in `timeline`.
    assert_eq!(
        db.query_i64("SELECT COUNT(*) AS value FROM sessions WHERE last_segment IS NOT NULL"),
        0
    );
    let (root, kid) = (SessionId(1), SessionId(2));
    let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
    rt().block_on(async {
        // Intact.
        let rows = store
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap();
        let seen: Vec<_> = rows
            .iter()
            .map(|r| (r.id, r.name.as_str(), r.parent, r.state, r.turns, r.chunks))
            .collect();
        assert_eq!(
            seen,
            vec![
                (root, "root", None, State::Finalized, 1, 2),
                (kid, "kid", Some(root), State::Running, 2, 2),
            ]
        );
        assert_eq!(rows[0].end_reason, Some(EndReason::Completed));
        assert_eq!(rows[0].finalized_at, Some(at(1_700_000_005_000)));
        assert_eq!(rows[1].resumed_from, None);
        let old = store.session_detail(root).await.unwrap();
        let turn = &old.turns[0];
        assert_eq!((turn.input.clone(), turn.error.clone()), (None, None));
        assert_eq!(turn.text(), "hello world");
        assert!(turn
            .chunks
            .iter()
            .all(|c| c.kind == ChunkKind::Text && c.data.is_none()));
        assert_eq!(
            (turn.started_at, turn.ended_at),
            (at(1_700_000_000_100), Some(at(1_700_000_000_900)))
        );
        // A cause is text: the first release's spelling of the finalize step
        // ("finalize: …", now "finalized: …") reads back as it was written.
        let causes: Vec<_> = old.timeline.iter().map(|t| t.cause.as_str()).collect();
        assert_eq!(
            causes,
            ["registered", "agent finished", "finalize: completed"]
        );
        let last = &old.timeline[2];
        assert_eq!(
            (last.at, last.from, last.to),
            (
                at(1_700_000_005_000),
                Some(State::Settled),
                State::Finalized
            )
        );
        assert_eq!(old.timeline[0].from, None);
        assert_eq!(
            store.memories(root).await.unwrap()[0].content,
            "hello world"
        );

        // The new columns work, on the old open turn and on new rows.
        let call = NewChunk::structured(ChunkKind::ToolCall, json!({"name": "scan"}));
        assert_eq!(store.append_chunk(kid, 2, call).await.unwrap().seq, 1);
        let error = TurnError::new(TurnErrorKind::Connect, "connection refused");
        write::end_turn(&store, kid, 2, Outcome::Failed, Some(error.clone()), now())
            .await
            .unwrap();
        let input = json!([{"role": "user", "content": "again"}]);
        write::start_turn(&store, kid, 3, Some(input.clone()), now())
            .await
            .unwrap();
        let detail = store.session_detail(kid).await.unwrap();
        assert_eq!(detail.turns[1].error, Some(error));
        assert_eq!(detail.turns[1].chunks[1].kind, ChunkKind::ToolCall);
        assert_eq!(detail.turns[1].text(), "open");
        assert_eq!(detail.turns[2].input, Some(TurnInput::whole(input)));
        let (owner, _) = session(&store, "new").await;
        let resumed = write::register(&store, NewSession::new("resumed", owner).resuming(root))
            .await
            .unwrap();
        assert!(resumed.get() > 2, "ids continue after the old ones");
        let row = store.session_detail(resumed).await.unwrap().session;
        assert_eq!(row.resumed_from, Some(root));
        // A finalize now keeps its session's last segment in its row; the
        // old segments read first, then that one.
        let won = write::finalize(&store, resumed, FinalizeRequest::new(EndReason::Completed))
            .await
            .unwrap();
        assert!(won.won());
        let timeline = store.session_detail(resumed).await.unwrap().timeline;
        let steps: Vec<_> = timeline.iter().map(|t| (t.from, t.to)).collect();
        assert_eq!(
            steps,
            [
                (None, State::Registered),
                (Some(State::Registered), State::Finalized)
            ]
        );
        assert_eq!(
            db.query_i64("SELECT COUNT(*) AS value FROM sessions WHERE last_segment IS NOT NULL"),
            1
        );

        // The old owner has no identity recorded: only its lease speaks for
        // it. Once that runs out, its live sessions are candidates.
        store
            .renew_lease(settle_store::OwnerId(1), Duration::ZERO)
            .await
            .unwrap();
        let candidates = store
            .recovery_candidates(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        assert_eq!(candidates.len(), 1);
        assert_eq!(candidates[0].session, kid);
        assert_eq!(candidates[0].owner.identity, HostIdentity::unknown());
        assert_eq!(candidates[0].owner.host, "old-host");
    });
}

/// SQLite: opening a database whose schema is current takes no write lock,
/// so `settle show` and `settle sessions` read while another process holds
/// the database's write lock (a long transaction, a `sqlite3` shell's
/// `BEGIN IMMEDIATE`) instead of failing after the busy timeout.
#[test]
pub(crate) fn opening_a_current_database_waits_for_no_writer() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.db");
    let url = path.to_str().unwrap().to_owned();
    rt().block_on(async {
        let store = Store::open(&url).unwrap();
        let id = session(&store, "root").await.1;
        drop(store);
        let mut writer = diesel::SqliteConnection::establish(&url).unwrap();
        writer.batch_execute("BEGIN IMMEDIATE").unwrap();
        let options = StoreOptions::default()
            .with_existing_only(true)
            .with_busy_timeout(Duration::from_millis(200));
        let reader = Store::open_with(&url, options);
        writer.batch_execute("ROLLBACK").unwrap();
        let reader = reader.expect("opened while another connection holds the write lock");
        assert_eq!(
            reader.session_detail(id).await.unwrap().session.name,
            "root"
        );
    });
}

/// SQLite: two processes (here threads, each with its own connections)
/// opening the same new file at once both get the store, and the file is
/// there after: the one that meets the other's lock while it switches the
/// file to WAL waits for it within the busy timeout, and neither removes a
/// file the other is using.
#[test]
pub(crate) fn g7_two_opens_of_one_new_file_at_once_both_succeed_and_keep_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for trial in 0..12 {
        let path = dir.path().join(format!("race-{trial}.db"));
        let url = path.to_str().unwrap().to_owned();
        let start = std::sync::Arc::new(std::sync::Barrier::new(2));
        let opens: Vec<_> = (0..2)
            .map(|_| {
                let (url, start) = (url.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    Store::open(&url).map(drop)
                })
            })
            .collect();
        for open in opens {
            let opened = open.join().unwrap();
            assert!(opened.is_ok(), "trial {trial}: {opened:?}");
        }
        assert!(path.exists(), "trial {trial}: the file was removed");
        rt().block_on(async {
            let store = Store::open(&url).unwrap();
            session(&store, "after").await;
        });
    }
}

/// SQLite: a new (empty) file whose write lock another connection holds
/// for a moment (a `sqlite3` shell's `BEGIN IMMEDIATE`) is waited for
/// within the busy timeout, as an existing database is, instead of
/// refused at once while the store switches it to WAL.
#[test]
pub(crate) fn g7_a_new_file_locked_for_a_moment_is_waited_for() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("new-locked.db");
    let url = path.to_str().unwrap().to_owned();
    let mut shell = diesel::SqliteConnection::establish(&url).unwrap();
    shell.batch_execute("BEGIN IMMEDIATE").unwrap();
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        shell.batch_execute("ROLLBACK").unwrap();
    });
    let options = StoreOptions::default().with_busy_timeout(Duration::from_secs(5));
    let opened = Store::open_with(&url, options);
    release.join().unwrap();
    let store = opened.expect("waited for the lock, within the busy timeout");
    rt().block_on(async {
        session(&store, "after the lock").await;
    });
}
