//! Bounded when the store stalls: a store whose database stops answering
//! cannot hold up its caller's exit, and PostgreSQL calls give up in time.

use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::Connection;
use settle_store::{
    Cause, LifecycleWrite, OpenError, SessionStore, State, Store, StoreError, StoreOptions,
};

use crate::common::{rt, Backend, TestDb};
use crate::{now, session};

/// Another process holds the SQLite file locked: the writer is stuck waiting
/// for it (a minute of busy timeout). Dropping the store still returns, while
/// the lock is held, and the process could exit.
#[test]
fn g9_dropping_a_store_whose_writer_is_stuck_returns() {
    let db = TestDb::new(Backend::Sqlite).unwrap();
    let options = StoreOptions::default()
        .with_busy_timeout(Duration::from_secs(60))
        .with_close_timeout(Duration::from_millis(100));
    let store = Store::open_with(&db.url, options).unwrap();
    let id = rt().block_on(async { session(&store, "s").await.1 });

    let mut holder = diesel::sqlite::SqliteConnection::establish(&db.url).unwrap();
    holder.batch_execute("BEGIN EXCLUSIVE").unwrap();
    // Queued without waiting: the writer takes it and blocks on the lock.
    let receipt = store.append_chunk(id, 1, "stuck".into());
    drop(store);
    // Still locked: the drop did not wait for the writer.
    holder.batch_execute("COMMIT").unwrap();
    // The writer, left behind, ends on its own once the lock is gone.
    let answer = rt().block_on(receipt);
    assert!(
        matches!(answer, Err(StoreError::UnknownTurn { .. })),
        "{answer:?}"
    );
}

/// PostgreSQL: a statement that waits on a row another transaction keeps
/// locked is cancelled by the statement timeout, and says so.
#[test]
fn postgres_a_statement_stuck_on_a_lock_is_cancelled() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let options = StoreOptions::default().with_pg_statement_timeout(Duration::from_millis(200));
    let store = Store::open_with(&db.url, options).unwrap();
    rt().block_on(async {
        let (_, id) = session(&store, "s").await;
        let mut holder = diesel::pg::PgConnection::establish(&db.url).unwrap();
        holder
            .batch_execute(&format!(
                "BEGIN; SELECT * FROM sessions WHERE id = {id} FOR UPDATE"
            ))
            .unwrap();
        let results = store
            .apply(vec![LifecycleWrite::Transition {
                session: id,
                from: State::Registered,
                to: State::Running,
                cause: Cause::TurnStarted,
                at: now(),
            }])
            .await;
        match &results[0] {
            Err(StoreError::Database { source, .. }) => {
                assert!(source.to_string().contains("statement timeout"), "{source}")
            }
            other => panic!("{other:?}"),
        }
        holder.batch_execute("ROLLBACK").unwrap();
        // The writer goes on: the next write goes through.
        let results = store
            .apply(vec![LifecycleWrite::Transition {
                session: id,
                from: State::Registered,
                to: State::Running,
                cause: Cause::TurnStarted,
                at: now(),
            }])
            .await;
        assert!(results[0].is_ok(), "{results:?}");
    });
}

/// A server that accepts the connection but never answers: opening gives up
/// after the connect timeout instead of hanging.
#[test]
fn g11_open_gives_up_on_a_server_that_never_answers() {
    // The kernel completes the handshake into the backlog; nobody speaks.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = format!("postgres://settle@127.0.0.1:{port}/settle");
    let options = StoreOptions::default().with_pg_connect_timeout(Duration::from_secs(2));
    let err = Store::open_with(&url, options).unwrap_err();
    assert!(matches!(err, OpenError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("timeout"), "{err}");
    drop(silent);
}

/// `Store::open_async` opens off the async workers: on a runtime with one
/// thread, an open that waits for another connection's lock lets the task
/// holding that lock run and release it.
#[test]
fn open_async_waits_off_the_async_workers() {
    let db = TestDb::new(Backend::Sqlite).unwrap();
    drop(Store::open(&db.url).unwrap());
    let single = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    single.block_on(async {
        let mut holder = diesel::sqlite::SqliteConnection::establish(&db.url).unwrap();
        holder.batch_execute("BEGIN EXCLUSIVE").unwrap();
        let options = StoreOptions::default().with_busy_timeout(Duration::from_secs(60));
        let opening = tokio::spawn(Store::open_with_async(db.url.clone(), options));
        // Let the open start and meet the lock.
        tokio::task::yield_now().await;
        // Reached only if the open did not take the runtime's one thread.
        holder.batch_execute("COMMIT").unwrap();
        let store = opening.await.unwrap().unwrap();
        let (_, id) = session(&store, "opened").await;
        assert!(store.session_detail(id).await.is_ok());
        store.close().await;
    });
}

/// Under a steady stream of commits (one chunk at a time, each awaited,
/// a reader beside them, no pause), SQLite's write-ahead log is
/// checkpointed but never started over (a commit must begin right after a
/// checkpoint caught up): it grows by every page each commit writes. Past
/// its limit it is truncated, so the disk it takes stays bounded.
#[test]
fn the_write_ahead_log_stays_near_its_limit_under_steady_commits() {
    let db = TestDb::new(Backend::Sqlite).unwrap();
    let limit = 1024 * 1024;
    let store = db.open_with(StoreOptions::default().with_wal_limit(limit));
    let wal = format!("{}-wal", db.path().display());
    let (largest, commits) = rt().block_on(async {
        let (_, id) = session(&*store, "steady").await;
        crate::write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        let (mut largest, mut commits) = (0, 0_u64);
        let began = std::time::Instant::now();
        while began.elapsed() < Duration::from_secs(3) {
            store
                .append_chunk(id, 1, format!("chunk {commits}").into())
                .await
                .unwrap();
            commits += 1;
            if commits % 25 == 0 {
                let _ = store.session_detail(id).await.unwrap();
            }
            largest = largest.max(std::fs::metadata(&wal).map_or(0, |m| m.len()));
        }
        (largest, commits)
    });
    assert!(
        largest < 4 * limit,
        "the WAL reached {largest} bytes over {commits} commits, with a limit of {limit}"
    );
}

/// A reader outside the store holding a snapshot (an `sqlite3` shell in a
/// transaction) keeps the write-ahead log from being truncated, and must
/// not keep the store from committing meanwhile: the truncation is tried
/// without waiting, and again later.
#[test]
fn an_outside_reader_holding_the_log_does_not_stall_the_commits() {
    let db = TestDb::new(Backend::Sqlite).unwrap();
    let store = db.open_with(StoreOptions::default().with_wal_limit(256 * 1024));
    let mut reader = diesel::sqlite::SqliteConnection::establish(&db.url).unwrap();
    let (slowest, commits) = rt().block_on(async {
        let (_, id) = session(&*store, "read").await;
        crate::write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        reader
            .batch_execute("BEGIN; SELECT count(*) FROM sessions;")
            .unwrap();
        let (mut slowest, mut commits) = (Duration::ZERO, 0_u64);
        let began = std::time::Instant::now();
        while began.elapsed() < Duration::from_secs(2) {
            let asked = std::time::Instant::now();
            store
                .append_chunk(id, 1, format!("chunk {commits}").into())
                .await
                .unwrap();
            slowest = slowest.max(asked.elapsed());
            commits += 1;
        }
        (slowest, commits)
    });
    reader.batch_execute("COMMIT").unwrap();
    assert!(
        slowest < Duration::from_millis(500),
        "a commit waited {slowest:?} ({commits} commits)"
    );
}
