//! Honest when the lease is lost (G8): expiry by the store's clock, no owner
//! write after it, and "same host" by machine identity and PID namespace.

use std::time::Duration;

use settle_store::{
    Cause, EndReason, FinalizeRequest, HostIdentity, LifecycleWrite, NewSession, OwnerGone,
    OwnerInfo, RecoverOptions, State, StoreError,
};

use crate::common::{rt, Backend, TestDb};
use crate::recovery::{expire, owner_elsewhere};
use crate::{append_all, now, open, write, HOUR};

fn lost(result: Result<(), StoreError>, what: &str) {
    assert!(
        matches!(result, Err(StoreError::LeaseLost(_))),
        "{what}: {result:?}"
    );
}

/// An owner whose lease expired writes nothing more, before and after its
/// sessions are recovered: its renewal and every write of its own (session
/// rows, turns, chunks, finalizes, registrations, batches) fail with
/// `LeaseLost`, and leave the rows as they were.
pub(crate) fn g8_an_owner_whose_lease_expired_gets_lease_lost_on_renew_and_writes(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let late = owner_elsewhere(&*store, 4_000_100).await;
        let busy = write::register(&*store, NewSession::new("busy", late))
            .await
            .unwrap();
        let idle = write::register(&*store, NewSession::new("idle", late))
            .await
            .unwrap();
        write::start_turn(&*store, busy, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, busy, 1, &["before"]).await;
        // It stalls past its lease (a SIGSTOP, a long GC pause).
        expire(&*store, late).await;
        let before = [
            store.session_detail(busy).await.unwrap(),
            store.session_detail(idle).await.unwrap(),
        ];

        let every_write = |round: &'static str| {
            let store = store.clone();
            async move {
                lost(store.renew_lease(late, HOUR).await.map(|_| ()), round);
                lost(
                    write::transition(
                        &*store,
                        busy,
                        State::Registered,
                        State::Running,
                        Cause::TurnStarted,
                        now(),
                    )
                    .await,
                    round,
                );
                lost(
                    write::start_turn(&*store, idle, 1, None, now()).await,
                    round,
                );
                lost(
                    store
                        .append_chunk(busy, 1, "after".into())
                        .await
                        .map(|_| ()),
                    round,
                );
                lost(
                    write::end_turn(
                        &*store,
                        busy,
                        1,
                        settle_store::Outcome::Completed,
                        None,
                        now(),
                    )
                    .await,
                    round,
                );
                lost(
                    write::finalize(&*store, idle, FinalizeRequest::new(EndReason::Completed))
                        .await
                        .map(|_| ()),
                    round,
                );
                lost(
                    write::register(&*store, NewSession::new("new", late))
                        .await
                        .map(|_| ()),
                    round,
                );
                let results = store
                    .apply(vec![
                        LifecycleWrite::Register(NewSession::new("new", late)),
                        LifecycleWrite::Transition {
                            session: idle,
                            from: State::Registered,
                            to: State::Settled,
                            cause: Cause::AgentFinished,
                            at: now(),
                        },
                        LifecycleWrite::Finalize {
                            session: busy,
                            plan: FinalizeRequest::new(EndReason::Shutdown),
                        },
                    ])
                    .await;
                for r in results {
                    lost(r.map(|_| ()), round);
                }
            }
        };
        every_write("before recovery").await;
        assert_eq!(store.session_detail(busy).await.unwrap(), before[0]);
        assert_eq!(store.session_detail(idle).await.unwrap(), before[1]);

        let report = store
            .recover(RecoverOptions {
                here: HostIdentity::unknown(),
                now: now(),
            })
            .await
            .unwrap();
        assert_eq!(report.recovered, vec![idle, busy]);
        assert_eq!(report.owners_gone, vec![(late, OwnerGone::LeaseExpired)]);
        every_write("after recovery").await;
        let busy_now = store.session_detail(busy).await.unwrap();
        assert_eq!(busy_now.session.end_reason, Some(EndReason::Recovered));
        assert_eq!(busy_now.turns[0].chunks.len(), 1, "no chunk after the loss");
    });
}

/// A recoverer whose clock runs ten minutes ahead does not take a live
/// owner's sessions: expiry is judged by the store's clock (PostgreSQL's
/// `now()`; on SQLite and in memory, this machine's), never the recoverer's.
pub(crate) fn g8_a_recoverer_whose_clock_runs_ahead_does_not_recover_a_live_owner(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let live = owner_elsewhere(&*store, 4_000_200).await;
        store
            .renew_lease(live, Duration::from_secs(30))
            .await
            .unwrap();
        let id = write::register(&*store, NewSession::new("live", live))
            .await
            .unwrap();
        let ahead = RecoverOptions {
            here: HostIdentity::unknown(),
            now: now() + Duration::from_secs(600),
        };
        assert!(store
            .recovery_candidates(ahead.clone())
            .await
            .unwrap()
            .is_empty());
        let report = store.recover(ahead).await.unwrap();
        assert!(report.recovered.is_empty(), "{report:?}");
        // The owner goes on as if nothing happened.
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        store.renew_lease(live, HOUR).await.unwrap();
    });
}

/// Two owners with the same host name on different machines (two
/// containers, two cloned machines): neither's live sessions are recovered
/// by the other because a pid is missing there. Only a recoverer in the same
/// machine and PID namespace takes that shortcut.
pub(crate) fn g8_owners_named_alike_on_different_machines_keep_their_live_sessions(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let gone = exited.id();
    exited.wait().unwrap();
    rt().block_on(async {
        let store = open(&db);
        let here = HostIdentity::this_process();
        let twin = |machine: &str| HostIdentity {
            machine: Some(machine.into()),
            pid_namespace: here.pid_namespace,
        };
        let register = |identity: HostIdentity| {
            let store = store.clone();
            async move {
                store
                    .register_owner(
                        OwnerInfo {
                            host: "worker".into(),
                            identity,
                            pid: gone,
                            started_at: now(),
                            advertise: None,
                        },
                        HOUR,
                    )
                    .await
                    .unwrap()
            }
        };
        let a = register(twin("machine-a")).await;
        let session = write::register(&*store, NewSession::new("on a", a))
            .await
            .unwrap();
        // Machine b, same name, looks for gone processes: the pid is gone
        // here, but it never named a process of machine a.
        let from_b = RecoverOptions {
            here: twin("machine-b"),
            now: now(),
        };
        assert!(store
            .recovery_candidates(from_b.clone())
            .await
            .unwrap()
            .is_empty());
        assert!(store.recover(from_b).await.unwrap().recovered.is_empty());
        let row = store.session_detail(session).await.unwrap().session;
        assert_eq!(row.state, State::Registered);
        // From machine a itself (same machine, same PID namespace), the
        // process is known gone.
        let from_a = RecoverOptions {
            here: twin("machine-a"),
            now: now(),
        };
        let report = store.recover(from_a).await.unwrap();
        assert_eq!(report.recovered, vec![session]);
        assert_eq!(report.owners_gone, vec![(a, OwnerGone::ProcessGone)]);
    });
}

/// PostgreSQL: a write held by a lock another session keeps (`LOCK TABLE`
/// as `VACUUM FULL` or `ALTER TABLE` take it, a peer frozen inside a
/// transaction) does not hold the lease's renewal behind it, which would
/// let a healthy process lose its lease (G8). SQLite has one writer at a
/// time whatever the connection: not asked of it.
#[test]
fn g8_on_postgres_a_write_held_by_a_lock_does_not_starve_the_lease_renewal() {
    use diesel::{Connection, RunQueryDsl};
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    rt().block_on(async {
        let store = open(&db);
        let me = crate::owner(&*store, HOUR).await;
        let id = write::register(&*store, NewSession::new("busy", me))
            .await
            .unwrap();
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();

        let (locked_tx, locked) = std::sync::mpsc::channel();
        let (free_tx, free) = std::sync::mpsc::channel::<()>();
        let url = db.url.clone();
        let holder = std::thread::spawn(move || {
            let mut conn = diesel::PgConnection::establish(&url).unwrap();
            conn.transaction(|c| {
                diesel::sql_query("LOCK TABLE chunks IN ACCESS EXCLUSIVE MODE").execute(c)?;
                locked_tx.send(()).unwrap();
                let _ = free.recv_timeout(Duration::from_secs(30));
                Ok::<_, diesel::result::Error>(())
            })
            .unwrap();
        });
        locked.recv().unwrap();
        // The writer takes the chunk and waits on the lock.
        let append = store.append_chunk(id, 1, "held".into());
        tokio::time::sleep(Duration::from_millis(300)).await;

        let renewed =
            tokio::time::timeout(Duration::from_secs(5), store.renew_lease(me, HOUR)).await;
        free_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(
            matches!(renewed, Ok(Ok(_))),
            "the renewal waited behind the held write: {renewed:?}"
        );
        // Once the lock is gone, the held write goes through.
        append.await.unwrap();
    });
}

/// Found from outside: on SQLite, a lease renewal asked while another
/// process held the file's write lock read the clock before it waited for
/// the lock, then renewed a lease that had run out while it waited (by
/// the clock then): the process went on writing as the owner of a lease
/// another process could already have recovered, and the store held a
/// lease renewed after it lapsed. The renewal reads the clock once it
/// holds the write lock: one that lapsed meanwhile is lost.
#[test]
fn g8_a_renewal_that_waited_for_the_write_lock_past_its_lease_is_refused() {
    use diesel::connection::SimpleConnection;
    use diesel::Connection;
    let db = TestDb::new(Backend::Sqlite).unwrap();
    let options = settle_store::StoreOptions::default().with_busy_timeout(Duration::from_secs(30));
    let store = std::sync::Arc::new(settle_store::Store::open_with(&db.url, options).unwrap());
    rt().block_on(async {
        let me = crate::owner(&*store, Duration::from_millis(800)).await;
        let mut holder = diesel::sqlite::SqliteConnection::establish(&db.url).unwrap();
        holder.batch_execute("BEGIN EXCLUSIVE").unwrap();
        let renewal = tokio::spawn({
            let store = store.clone();
            async move { settle_store::SessionStore::renew_lease(&*store, me, HOUR).await }
        });
        // The lease runs out while the renewal waits for the lock.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        holder.batch_execute("COMMIT").unwrap();
        let renewed = renewal.await.unwrap();
        assert!(
            matches!(renewed, Err(StoreError::LeaseLost(_))),
            "a lease that ran out while its renewal waited was renewed: {renewed:?}"
        );
    });
}
