//! A fleet of processes on one database (SPEC §12, G12): a session released
//! by its owner is adopted once, by one conditional update; its former
//! owner writes it no more; one nobody adopts is reaped `idle_reap` once;
//! a crashed peer's sessions are released with their open turn
//! `interrupted` (G8), and `settle recover` leaves released ones alone.

use std::sync::Arc;
use std::time::Duration;

use settle_store::{
    Cause, EndReason, FinalizeRequest, Holds, LifecycleWrite, NewSession, Outcome, OwnerId,
    OwnerInfo, RecoverOptions, SessionFilter, SessionId, SessionStore, State, StoreError,
    Whereabouts,
};

use crate::common::{rt, Backend, TestDb};
use crate::recovery::expire;
use crate::{append_all, now, open, write, HOUR};

async fn node(store: &dyn SessionStore, url: &str) -> OwnerId {
    store
        .register_owner(OwnerInfo::this_process().advertising(url), HOUR)
        .await
        .unwrap()
}

/// A session of `owner` that ran one completed turn.
async fn conversation(store: &dyn SessionStore, owner: OwnerId) -> SessionId {
    let id = write::register(store, NewSession::new("chat", owner))
        .await
        .unwrap();
    let at = now();
    write::transition(
        store,
        id,
        State::Registered,
        State::Running,
        Cause::TurnStarted,
        at,
    )
    .await
    .unwrap();
    write::start_turn(store, id, 1, None, at).await.unwrap();
    append_all(store, id, 1, &["hello"]).await;
    write::end_turn(store, id, 1, Outcome::Completed, None, at)
        .await
        .unwrap();
    let ended = Cause::TurnEnded(Outcome::Completed);
    write::transition(store, id, State::Running, State::Registered, ended, at)
        .await
        .unwrap();
    id
}

fn causes(detail: &settle_store::SessionDetail) -> Vec<String> {
    detail.timeline.iter().map(|t| t.cause.clone()).collect()
}

/// Two processes racing to adopt one released session: exactly one wins,
/// the other is told where the winner is; the winner goes on with the turn
/// count and the history, the timeline says `handoff` then `adopted`.
pub(crate) fn g12_two_processes_racing_to_adopt_a_released_session_adopt_it_once(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (a, b1, b2) = (open(&db), open(&db), open(&db));
        let node_a = node(&*a, "ws://a/ws").await;
        let node_b = node(&*b1, "ws://b/ws").await;
        let node_c = node(&*b2, "ws://c/ws").await;
        let id = conversation(&*a, node_a).await;
        a.release(node_a, id, Holds::default(), now())
            .await
            .unwrap();
        assert_eq!(a.locate(id).await.unwrap(), Whereabouts::Released);
        let (one, two) = tokio::join!(b1.adopt(node_b, id, now()), b2.adopt(node_c, id, now()));
        let (won, lost, winner) = match (&one, &two) {
            (Ok(won), Err(lost)) => (won, lost, "ws://b/ws"),
            (Err(lost), Ok(won)) => (won, lost, "ws://c/ws"),
            other => panic!("exactly one adoption wins: {other:?}"),
        };
        match lost {
            StoreError::Elsewhere { session, advertise } => {
                assert_eq!(*session, id);
                assert_eq!(advertise.as_deref(), Some(winner));
            }
            other => panic!("the loser is told where the winner is: {other:?}"),
        }
        assert_eq!(won.turns, 1);
        assert_eq!(won.last_outcome, Some(Outcome::Completed));
        let detail = a.session_detail(id).await.unwrap();
        assert_eq!(detail.session.state, State::Registered);
        assert_eq!(detail.turns[0].text(), "hello");
        let causes = causes(&detail);
        let n = causes.len();
        assert_eq!(&causes[n - 2..], ["handoff", "adopted"], "{causes:?}");
        let rows = a.list_sessions(SessionFilter::all()).await.unwrap();
        assert_eq!(rows[0].owner.as_deref(), Some(winner));
    });
}

/// The former owner of a released session writes it no more, before and
/// after another process adopts it, although the adopter's lease is live
/// (fencing per writer): its transitions, turns and finalize are refused
/// `HandedOff`, and the adopter's writes go on.
pub(crate) fn g12_g8_the_former_owner_never_writes_a_released_or_adopted_session(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let node_a = node(&*store, "ws://a/ws").await;
        let node_b = node(&*store, "ws://b/ws").await;
        let id = conversation(&*store, node_a).await;
        store
            .release(node_a, id, Holds::default(), now())
            .await
            .unwrap();
        let late = |owner: OwnerId| {
            let store = store.clone();
            async move {
                let writes = vec![
                    LifecycleWrite::Transition {
                        session: id,
                        from: State::Registered,
                        to: State::Running,
                        cause: Cause::TurnStarted,
                        at: now(),
                    },
                    LifecycleWrite::Finalize {
                        session: id,
                        plan: FinalizeRequest::new(EndReason::Shutdown),
                    },
                ];
                store.apply_as(owner, writes).await
            }
        };
        for answer in late(node_a).await {
            assert!(
                matches!(answer, Err(StoreError::HandedOff { .. })),
                "released: {answer:?}"
            );
        }
        // Released: nobody writes it, whoever asks.
        assert!(matches!(
            write::transition(
                &*store,
                id,
                State::Registered,
                State::Running,
                Cause::TurnStarted,
                now()
            )
            .await,
            Err(StoreError::HandedOff { .. })
        ));
        store.adopt(node_b, id, now()).await.unwrap();
        for answer in late(node_a).await {
            assert!(
                matches!(answer, Err(StoreError::HandedOff { .. })),
                "adopted elsewhere: {answer:?}"
            );
        }
        assert!(matches!(
            store.release(node_a, id, Holds::default(), now()).await,
            Err(StoreError::HandedOff { .. })
        ));
        let start = LifecycleWrite::Transition {
            session: id,
            from: State::Registered,
            to: State::Running,
            cause: Cause::TurnStarted,
            at: now(),
        };
        let answers = store.apply_as(node_b, vec![start]).await;
        assert!(answers[0].is_ok(), "{answers:?}");
        assert_eq!(
            store.session_detail(id).await.unwrap().session.state,
            State::Running
        );
    });
}

/// A released session nobody adopts within the idle TTL is finalized
/// `idle_reap` once, by whichever process sweeps first; after it nobody
/// adopts it. One adopted in time is never reaped (G3).
pub(crate) fn g12_g2_a_released_session_nobody_adopts_is_reaped_once(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (one, two) = (open(&db), open(&db));
        let node_a = node(&*one, "ws://a/ws").await;
        let node_b = node(&*two, "ws://b/ws").await;
        let left = conversation(&*one, node_a).await;
        let taken = conversation(&*one, node_a).await;
        one.release(node_a, left, Holds::default(), now())
            .await
            .unwrap();
        one.release(node_a, taken, Holds::default(), now())
            .await
            .unwrap();
        two.adopt(node_b, taken, now()).await.unwrap();
        // Not yet due.
        assert!(one.reap_released(HOUR).await.unwrap().is_empty());
        let (x, y) = tokio::join!(
            one.reap_released(Duration::ZERO),
            two.reap_released(Duration::ZERO)
        );
        let mut reaped = x.unwrap();
        reaped.extend(y.unwrap());
        assert_eq!(
            reaped,
            vec![left],
            "reaped once, and only the one nobody adopted"
        );
        let detail = one.session_detail(left).await.unwrap();
        assert_eq!(detail.session.end_reason, Some(EndReason::IdleReap));
        assert!(matches!(
            two.adopt(node_b, left, now()).await,
            Err(StoreError::SessionClosed(_))
        ));
        assert_eq!(
            one.session_detail(taken).await.unwrap().session.state,
            State::Registered
        );
    });
}

/// A session released while held (input asked of a person, a delegation
/// outstanding) is no idle session: the fleet's reap leaves it, and its
/// adopter takes its holds on, once; released again without them, it is
/// reaped as any other (G3, G12).
pub(crate) fn g3_g12_a_held_release_is_not_reaped_and_its_holds_go_to_its_adopter(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (one, two) = (open(&db), open(&db));
        let node_a = node(&*one, "ws://a/ws").await;
        let node_b = node(&*two, "ws://b/ws").await;
        let held = conversation(&*one, node_a).await;
        let holds = Holds {
            pending_input: 1,
            delegation: 2,
        };
        one.release(node_a, held, holds, now()).await.unwrap();
        assert!(two.reap_released(Duration::ZERO).await.unwrap().is_empty());
        let adopted = two.adopt(node_b, held, now()).await.unwrap();
        assert_eq!(adopted.holds, holds);
        // Its holds went with it: released again by one that ended them,
        // it is idle, and reaped once due.
        two.release(node_b, held, Holds::default(), now())
            .await
            .unwrap();
        let again = one.adopt(node_a, held, now()).await.unwrap();
        assert_eq!(again.holds, Holds::default());
        one.release(node_a, held, Holds::default(), now())
            .await
            .unwrap();
        assert_eq!(two.reap_released(Duration::ZERO).await.unwrap(), vec![held]);
    });
}

/// A held session whose owner crashed keeps its holds (SPEC §5, G3, G12):
/// they were recorded as they changed, so the live process that releases
/// the crashed owner's sessions leaves it to no reap, and its adopter takes
/// the holds on. Holds given back are dropped; a record by a process that
/// no longer owns the session, or after its finalize, changes nothing.
pub(crate) fn g3_g12_a_crashed_owners_held_session_is_adopted_held(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (one, two) = (open(&db), open(&db));
        let crashed = node(&*one, "ws://a/ws").await;
        let live = node(&*two, "ws://b/ws").await;
        let held = conversation(&*one, crashed).await;
        let unheld = conversation(&*one, crashed).await;
        let holds = Holds {
            pending_input: 1,
            delegation: 0,
        };
        one.record_holds(crashed, held, holds).await.unwrap();
        // Taken and given back: nothing is kept.
        one.record_holds(crashed, unheld, holds).await.unwrap();
        one.record_holds(crashed, unheld, Holds::default())
            .await
            .unwrap();
        // A process that does not own it says nothing of its holds.
        two.record_holds(live, unheld, holds).await.unwrap();

        expire(&*two, crashed).await;
        let report = two.release_expired(live, now()).await.unwrap();
        assert_eq!(report.released, vec![held, unheld]);
        // Held, it is no idle session to the fleet's reap.
        assert_eq!(
            two.reap_released(Duration::ZERO).await.unwrap(),
            vec![unheld]
        );
        let adopted = two.adopt(live, held, now()).await.unwrap();
        assert_eq!(adopted.holds, holds);

        // Once finalized, a late record keeps nothing for anyone.
        let ended = write::finalize(&*two, held, FinalizeRequest::new(EndReason::UserClose))
            .await
            .unwrap();
        assert!(
            matches!(ended, settle_store::Finalized::Won(_)),
            "{ended:?}"
        );
        two.record_holds(live, held, holds).await.unwrap();
        assert!(two.adopt(live, held, now()).await.is_err());
    });
}

/// A peer that crashed: once its lease expired, a live process releases its
/// sessions for adoption, the turn it left open marked `interrupted` with
/// its acknowledged chunks kept (G7, G8); `settle recover` finalizes only
/// what was left by a crash and not released.
pub(crate) fn g8_g12_a_crashed_peers_sessions_are_released_with_their_turn_interrupted(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store: Arc<dyn SessionStore> = open(&db);
        let crashed = node(&*store, "ws://a/ws").await;
        let live = node(&*store, "ws://b/ws").await;
        let idle = conversation(&*store, crashed).await;
        let busy = conversation(&*store, crashed).await;
        let at = now();
        write::transition(
            &*store,
            busy,
            State::Registered,
            State::Running,
            Cause::TurnStarted,
            at,
        )
        .await
        .unwrap();
        write::start_turn(&*store, busy, 2, None, at).await.unwrap();
        append_all(&*store, busy, 2, &["half", " a reply"]).await;
        // Not before its lease expired.
        let report = store.release_expired(live, now()).await.unwrap();
        assert!(report.released.is_empty(), "{report:?}");
        expire(&*store, crashed).await;
        let report = store.release_expired(live, now()).await.unwrap();
        assert_eq!(report.released, vec![idle, busy]);
        assert_eq!(report.interrupted_turns, vec![(busy, 2)]);
        let detail = store.session_detail(busy).await.unwrap();
        assert_eq!(detail.session.state, State::Registered);
        assert_eq!(detail.turns[1].outcome, Some(Outcome::Interrupted));
        assert_eq!(detail.turns[1].text(), "half a reply");
        // Released: recovery leaves them to adoption.
        let recovered = store
            .recover(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        assert!(recovered.recovered.is_empty(), "{recovered:?}");
        let adopted = store.adopt(live, busy, now()).await.unwrap();
        assert_eq!(adopted.turns, 2);
        assert_eq!(adopted.last_outcome, Some(Outcome::Interrupted));
        // A second sweep finds nothing more.
        let again = store.release_expired(live, now()).await.unwrap();
        assert!(again.released.is_empty());
    });
}

/// A session's principal is kept with it, for the process that adopts it.
pub(crate) fn g12_a_sessions_principal_comes_with_its_adoption(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let node_a = node(&*store, "ws://a/ws").await;
        let node_b = node(&*store, "ws://b/ws").await;
        let id = conversation(&*store, node_a).await;
        store.set_principal(id, Some("alice".into())).await.unwrap();
        store
            .release(node_a, id, Holds::default(), now())
            .await
            .unwrap();
        let adopted = store.adopt(node_b, id, now()).await.unwrap();
        assert_eq!(adopted.principal.as_deref(), Some("alice"));
        // Its detail names where its owner is, as its listing does.
        let detail = store.session_detail(id).await.unwrap();
        assert_eq!(detail.session.owner.as_deref(), Some("ws://b/ws"));
        // Listed by the principal recorded for it, on any process.
        let anonymous = conversation(&*store, node_b).await;
        let listed = |principal: Option<&str>| {
            let store = store.clone();
            let filter = SessionFilter::all().of_principal(principal.map(str::to_owned));
            async move {
                let rows = store.list_sessions(filter).await.unwrap();
                rows.iter().map(|r| r.id).collect::<Vec<_>>()
            }
        };
        assert_eq!(listed(Some("alice")).await, vec![id]);
        assert_eq!(listed(Some("mallory")).await, Vec::<SessionId>::new());
        assert_eq!(listed(None).await, vec![anonymous]);
        assert_eq!(
            store.locate(id).await.unwrap(),
            Whereabouts::Owned {
                owner: node_b,
                advertise: Some("ws://b/ws".into()),
                live: true
            }
        );
    });
}

/// PostgreSQL: a transaction another process holds open (an operator's
/// `SELECT … FOR UPDATE`, a peer's write not committed yet): `sql` run on
/// a connection of its own, in a thread, until released, then `linger`
/// more before its commit.
struct Held {
    release: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Held {
    /// Returns once `sql` ran, its transaction open.
    fn open(url: &str, sql: String, linger: Duration) -> Held {
        use diesel::{Connection, RunQueryDsl};
        let (ran_tx, ran) = std::sync::mpsc::channel();
        let (release, released) = std::sync::mpsc::channel::<()>();
        let url = url.to_owned();
        let thread = std::thread::spawn(move || {
            let mut conn = diesel::PgConnection::establish(&url).unwrap();
            conn.transaction(|c| {
                diesel::sql_query(sql).execute(c)?;
                ran_tx.send(()).unwrap();
                let _ = released.recv_timeout(Duration::from_secs(60));
                std::thread::sleep(linger);
                Ok::<_, diesel::result::Error>(())
            })
            .unwrap();
        });
        ran.recv().unwrap();
        Held { release, thread }
    }

    /// Lets its transaction commit (after `linger`).
    fn release(&self) {
        let _ = self.release.send(());
    }

    /// Lets it commit and waits for that.
    fn finish(self) {
        self.release();
        self.thread.join().unwrap();
    }
}

/// PostgreSQL: a move of the fleet that meets a row lock another session
/// holds (an operator's `SELECT … FOR UPDATE`, a peer frozen inside a
/// transaction) gives up after its bounded lock wait, taking nothing,
/// instead of holding every write of the store behind it.
#[test]
fn g12_on_postgres_an_adoption_that_meets_a_held_row_lock_gives_up_and_writes_go_on() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    rt().block_on(async {
        let store = open(&db);
        let node_a = node(&*store, "ws://a/ws").await;
        let node_b = node(&*store, "ws://b/ws").await;
        let id = conversation(&*store, node_a).await;
        store
            .release(node_a, id, Holds::default(), now())
            .await
            .unwrap();
        let busy = conversation(&*store, node_b).await;
        write::start_turn(&*store, busy, 2, None, now())
            .await
            .unwrap();

        let raw = i64::try_from(id.get()).unwrap();
        let holder = Held::open(
            &db.url,
            format!("SELECT id FROM sessions WHERE id = {raw} FOR UPDATE"),
            Duration::ZERO,
        );
        let tried =
            tokio::time::timeout(Duration::from_secs(8), store.adopt(node_b, id, now())).await;
        // Meanwhile-queued writes are not held for the lock's holder.
        let appended = tokio::time::timeout(
            Duration::from_secs(8),
            store.append_chunk(busy, 2, "on".into()),
        )
        .await;
        holder.finish();
        assert!(
            matches!(tried, Ok(Err(_))),
            "the adoption waited on the lock: {tried:?}"
        );
        assert!(
            matches!(appended, Ok(Ok(_))),
            "a write waited behind it: {appended:?}"
        );
        assert_eq!(store.locate(id).await.unwrap(), Whereabouts::Released);
        // Once the lock is gone, it is adopted.
        store.adopt(node_b, id, now()).await.unwrap();
    });
}

/// PostgreSQL: an append whose turn another process is ending (a peer
/// adopting the session ends the turn it found open) waits for that end
/// and is refused `TurnClosed`, rather than reading the turn open in its
/// snapshot and committing a chunk after the turn's end: its claim of
/// the turn's numbers writes the turn's row, so it waits for the row's
/// other writer and reads the turn ended once that commits. (An append
/// that only read the turn, a cheaper statement, commits the chunk: this
/// test caught it.)
#[test]
fn g12_on_postgres_an_append_racing_the_end_of_its_turn_elsewhere_is_refused() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    rt().block_on(async {
        let store = open(&db);
        let owner = node(&*store, "ws://a/ws").await;
        let id = conversation(&*store, owner).await;
        write::start_turn(&*store, id, 2, None, now())
            .await
            .unwrap();
        assert_eq!(append_all(&*store, id, 2, &["a"]).await, [0]);

        let raw = i64::try_from(id.get()).unwrap();
        // The append, under way, meets the uncommitted end.
        let ender = Held::open(
            &db.url,
            format!(
                "UPDATE turns SET ended_at = 1, outcome = 'interrupted' \
                 WHERE session = {raw} AND \"no\" = 2"
            ),
            Duration::from_millis(300),
        );
        let receipt = store.append_chunk(id, 2, "b".into());
        ender.release();
        let appended = tokio::time::timeout(Duration::from_secs(20), receipt).await;
        ender.finish();
        assert!(
            matches!(appended, Ok(Err(StoreError::TurnClosed { .. }))),
            "an append racing its turn's end: {appended:?}"
        );
        let detail = store.session_detail(id).await.unwrap();
        let texts: Vec<&str> = detail.turns[1]
            .chunks
            .iter()
            .map(|c| c.text.as_str())
            .collect();
        assert_eq!(texts, ["a"], "a chunk was committed after its turn ended");
    });
}

/// G1, G12: a tree of three levels handed off moves whole whichever of its
/// sessions is attached first. Adopting the grandchild adopts its parent
/// and the root too: the middle session was left behind (its ancestors
/// read on the way up were taken for children already queued), registered
/// and owned by nobody, and the root could then be finalized over it.
pub(crate) fn g1_g12_adopting_a_grandchild_adopts_its_whole_tree(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (a, b1) = (open(&db), open(&db));
        let node_a = node(&*a, "ws://a/ws").await;
        let node_b = node(&*b1, "ws://b/ws").await;
        let new = |name: &str| NewSession::new(name, node_a);
        let root = write::register(&*a, new("root")).await.unwrap();
        let middle = write::register(&*a, new("middle").with_parent(root))
            .await
            .unwrap();
        let leaf = write::register(&*a, new("leaf").with_parent(middle))
            .await
            .unwrap();
        for id in [leaf, middle, root] {
            a.release(node_a, id, Holds::default(), now())
                .await
                .unwrap();
        }
        let adopted = b1.adopt(node_b, leaf, now()).await.unwrap();
        assert_eq!(adopted.session, leaf);
        let mut with: Vec<SessionId> = adopted.with.iter().map(|w| w.session).collect();
        with.sort();
        assert_eq!(with, [root, middle], "the rest of the tree came with it");
        for id in [root, middle, leaf] {
            assert!(
                matches!(b1.locate(id).await.unwrap(), Whereabouts::Owned { owner, .. } if owner == node_b),
                "{id:?} is not the adopter's"
            );
        }
    });
}

/// A peer on this machine whose process is gone, its lease still running:
/// its sessions are released for adoption at once, as `settle recover`
/// takes them (same machine identity and PID namespace, pid gone), not
/// only once its lease has run out; a live peer's are left alone.
pub(crate) fn g8_g12_a_peer_whose_process_is_gone_here_is_released_before_its_lease_ends(
    b: Backend,
) {
    let Some(db) = TestDb::new(b) else { return };
    let mut exited = std::process::Command::new("true").spawn().unwrap();
    let gone = exited.id();
    exited.wait().unwrap();
    rt().block_on(async {
        let store = open(&db);
        let crashed = store
            .register_owner(
                OwnerInfo {
                    pid: gone,
                    ..OwnerInfo::this_process().advertising("ws://a/ws")
                },
                HOUR,
            )
            .await
            .unwrap();
        let alive = node(&*store, "ws://c/ws").await;
        let live = node(&*store, "ws://b/ws").await;
        let left = conversation(&*store, crashed).await;
        let taken = conversation(&*store, crashed).await;
        let kept = conversation(&*store, alive).await;
        // Gone, not live: adopted at once, as an expired peer's session is.
        assert!(matches!(
            store.locate(taken).await.unwrap(),
            Whereabouts::Owned { live: false, .. }
        ));
        assert_eq!(
            store.adopt(live, taken, now()).await.unwrap().session,
            taken
        );
        let report = store.release_expired(live, now()).await.unwrap();
        assert_eq!(report.released, vec![left], "{report:?}");
        let adopted = store.adopt(live, left, now()).await.unwrap();
        assert_eq!(adopted.session, left);
        assert!(matches!(
            store.locate(kept).await.unwrap(),
            Whereabouts::Owned { live: true, .. }
        ));
    });
}

/// A session registered for a principal is recorded as its in the same
/// write as its row: in every store, with the other registrations of its
/// batch (one without a principal stays the anonymous one's), so that no
/// session is ever created without the owner it was created for.
pub(crate) fn a_principal_is_recorded_with_its_sessions_registration(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let me = node(&*store, "ws://a/ws").await;
        let answers = store
            .apply(vec![
                LifecycleWrite::Register(NewSession::new("hers", me).for_principal("alice")),
                LifecycleWrite::Register(NewSession::new("nobody's", me)),
            ])
            .await;
        let ids: Vec<SessionId> = answers
            .into_iter()
            .map(|a| match a {
                Ok(settle_store::Applied::Registered(id)) => id,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            store.principal(ids[0]).await.unwrap().as_deref(),
            Some("alice")
        );
        assert_eq!(store.principal(ids[1]).await.unwrap(), None);
        let filter = SessionFilter::all().of_principal(Some("alice".into()));
        let listed: Vec<SessionId> = store
            .list_sessions(filter)
            .await
            .unwrap()
            .iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(listed, vec![ids[0]]);
    });
}

/// Found from outside (G1, G3 in a fleet): a released tree nobody adopted,
/// one of whose children is held, had its parent finalized `idle_reap`
/// over the held child, which lived on under a finalized parent (the reap
/// looked at each session's own holds only, and took parents first).
/// Children are reaped before their parents, and a parent is reaped only
/// once none of its children is live, checked in the claim's own
/// transaction.
pub(crate) fn g1_g3_the_fleets_reap_never_finalizes_a_parent_over_a_live_child(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (a, b1) = (open(&db), open(&db));
        let node_a = node(&*a, "ws://a/ws").await;
        let node_b = node(&*b1, "ws://b/ws").await;
        let new = |name: &str| NewSession::new(name, node_a);
        let root = write::register(&*a, new("root")).await.unwrap();
        let held = write::register(&*a, new("held").with_parent(root))
            .await
            .unwrap();
        let middle = write::register(&*a, new("middle").with_parent(root))
            .await
            .unwrap();
        let leaf = write::register(&*a, new("leaf").with_parent(middle))
            .await
            .unwrap();
        let holds = Holds {
            pending_input: 1,
            delegation: 0,
        };
        for (id, holds) in [
            (leaf, Holds::default()),
            (middle, Holds::default()),
            (held, holds),
            (root, Holds::default()),
        ] {
            a.release(node_a, id, holds, now()).await.unwrap();
        }
        let reaped = b1.reap_released(Duration::ZERO).await.unwrap();
        assert_eq!(
            reaped,
            vec![leaf, middle],
            "the leaf before its parent, and not the root over its held child"
        );
        let state = |store: Arc<dyn SessionStore>, id| async move {
            store.session_detail(id).await.unwrap().session.state
        };
        assert_eq!(state(a.clone(), root).await, State::Registered);
        assert_eq!(state(a.clone(), held).await, State::Registered);
        // Its hold given back, the held child is reaped, then the root.
        let adopted = b1.adopt(node_b, held, now()).await.unwrap();
        assert_eq!(adopted.holds, holds);
        for id in [held, root] {
            b1.release(node_b, id, Holds::default(), now())
                .await
                .unwrap();
        }
        assert_eq!(
            a.reap_released(Duration::ZERO).await.unwrap(),
            vec![held, root]
        );
    });
}

/// Found from outside (G8, SPEC §12): `settle recover` finalized sessions
/// a live peer released for adoption after recovery had read its
/// candidates (it checked "not released" in its first snapshot only).
/// Each piece re-reads whether its sessions were released since, in its
/// own transaction. Here a trigger releases a session of the second piece
/// when the first piece's commit finalizes its first session: in between,
/// as a peer's sweep would.
pub(crate) fn g8_g12_recovery_leaves_a_session_released_after_it_read_its_candidates(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let crashed = node(&*store, "ws://a/ws").await;
        let mut ids = Vec::new();
        // More than one piece of recovery's transactions (256 sessions).
        for n in 0..260 {
            let id = write::register(&*store, NewSession::new(format!("s{n}"), crashed))
                .await
                .unwrap();
            ids.push(id.get());
        }
        let (oldest, newest) = (ids[0], ids[ids.len() - 1]);
        // Recovery takes the newest first: the oldest is in its last piece.
        release_when_finalized(&db, b, newest, oldest);
        expire(&*store, crashed).await;
        let report = store
            .recover(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        let oldest = SessionId(oldest);
        assert_eq!(report.recovered.len(), ids.len() - 1, "{report:?}");
        assert!(!report.recovered.contains(&oldest), "{report:?}");
        let detail = store.session_detail(oldest).await.unwrap();
        assert_eq!(detail.session.state, State::Registered, "{detail:?}");
    });
}

/// Found from outside (PostgreSQL): `settle recover` that met a row lock
/// another database session holds (an operator's `SELECT … FOR UPDATE`, a
/// peer frozen inside a transaction) waited for it without bound or word
/// (24 s in the look, as long as the lock). It gives up after the fleet's
/// bounded lock wait, saying so, and recovers once the lock is gone.
#[test]
fn g8_on_postgres_a_recovery_that_meets_a_held_row_lock_gives_up_and_says_so() {
    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    rt().block_on(async {
        let store = open(&db);
        let crashed = node(&*store, "ws://a/ws").await;
        let id = conversation(&*store, crashed).await;
        expire(&*store, crashed).await;
        let raw = i64::try_from(id.get()).unwrap();
        let holder = Held::open(
            &db.url,
            format!("SELECT id FROM sessions WHERE id = {raw} FOR UPDATE"),
            Duration::ZERO,
        );
        let tried = tokio::time::timeout(
            Duration::from_secs(8),
            store.recover(RecoverOptions::now_on_this_host()),
        )
        .await;
        holder.finish();
        let said = match tried {
            Ok(Err(error)) => error.to_string(),
            other => panic!("the recovery waited on the lock: {other:?}"),
        };
        assert!(
            said.contains("row another database session holds locked"),
            "{said}"
        );
        assert!(said.contains("run the recovery again"), "{said}");
        let report = store
            .recover(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        assert_eq!(report.recovered, vec![id]);
    });
}

/// The same within one piece (found on the recheck, 7 runs in 8): a
/// session a peer released between recovery's read of its piece and the
/// piece's update was missed by the update, taken up again on its own,
/// and finalized there, where only its owner was checked. Here a trigger
/// releases the piece's newest session when the update reaches its
/// oldest.
pub(crate) fn g8_g12_recovery_leaves_a_session_released_while_its_piece_is_written(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let crashed = node(&*store, "ws://a/ws").await;
        let mut ids = Vec::new();
        for n in 0..3 {
            let id = write::register(&*store, NewSession::new(format!("s{n}"), crashed))
                .await
                .unwrap();
            ids.push(id.get());
        }
        let (oldest, newest) = (ids[0], ids[2]);
        release_when_finalized(&db, b, oldest, newest);
        expire(&*store, crashed).await;
        let report = store
            .recover(RecoverOptions::now_on_this_host())
            .await
            .unwrap();
        let newest = SessionId(newest);
        assert!(!report.recovered.contains(&newest), "{report:?}");
        assert_eq!(report.recovered.len(), 2, "{report:?}");
        let detail = store.session_detail(newest).await.unwrap();
        assert_eq!(detail.session.state, State::Registered, "{detail:?}");
    });
}

/// A trigger that releases session `released` (as a peer's sweep does:
/// `released_at` set, its version moved) in the transaction that
/// finalizes session `when`: a release that lands between two of
/// recovery's steps, at a moment a test chooses.
fn release_when_finalized(db: &TestDb, b: Backend, when: u64, released: u64) {
    let release =
        format!("UPDATE sessions SET released_at = 1, version = version + 1 WHERE id = {released}");
    match b {
        Backend::Sqlite => db.execute(&format!(
            "CREATE TRIGGER released_meanwhile AFTER UPDATE OF state ON sessions \
             WHEN NEW.id = {when} AND NEW.state = 'finalized' BEGIN {release}; END;"
        )),
        Backend::Postgres => db.execute(&format!(
            "CREATE FUNCTION released_meanwhile() RETURNS trigger AS $$ \
             BEGIN IF NEW.id = {when} AND NEW.state = 'finalized' THEN {release}; END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql; \
             CREATE TRIGGER released_meanwhile AFTER UPDATE ON sessions \
             FOR EACH ROW EXECUTE FUNCTION released_meanwhile();"
        )),
        Backend::Memory => unreachable!("a database test"),
    }
}

/// A handoff of many sessions in one call: each idle one of the caller's is
/// released with its holds and its timeline step, and adopted as one
/// released alone is; one that is not idle, one already finalized and one
/// another process owns are refused on their own, in their place, leaving
/// the others released; a session released already by the caller (a try
/// whose answer was lost) is taken as done.
pub(crate) fn g12_releasing_many_sessions_at_once_refuses_each_that_may_not_go_alone(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (a, other) = (open(&db), open(&db));
        let node_a = node(&*a, "ws://a/ws").await;
        let node_b = node(&*other, "ws://b/ws").await;
        let idle: Vec<SessionId> = {
            let mut ids = Vec::new();
            for _ in 0..5 {
                ids.push(conversation(&*a, node_a).await);
            }
            ids
        };
        let running = conversation(&*a, node_a).await;
        write::transition(
            &*a,
            running,
            State::Registered,
            State::Running,
            Cause::TurnStarted,
            now(),
        )
        .await
        .unwrap();
        let elsewhere = conversation(&*other, node_b).await;
        let released_before = conversation(&*a, node_a).await;
        a.release(node_a, released_before, Holds::default(), now())
            .await
            .unwrap();
        let held = Holds {
            pending_input: 1,
            delegation: 0,
        };
        let mut asked: Vec<settle_store::Release> = idle
            .iter()
            .map(|&session| settle_store::Release {
                session,
                holds: Holds::default(),
                at: now(),
            })
            .collect();
        asked[0].holds = held;
        for session in [running, elsewhere, released_before] {
            asked.insert(
                2,
                settle_store::Release {
                    session,
                    holds: Holds::default(),
                    at: now(),
                },
            );
        }
        let results = a.release_all(node_a, asked.clone()).await;
        assert_eq!(results.len(), asked.len());
        for (one, result) in asked.iter().zip(&results) {
            let s = one.session;
            match result {
                Ok(()) => assert!(idle.contains(&s) || s == released_before, "{s}: {result:?}"),
                Err(StoreError::StateMismatch { session, .. }) => {
                    assert_eq!((s, *session), (running, running))
                }
                Err(StoreError::HandedOff { session, .. }) => {
                    assert_eq!((s, *session), (elsewhere, elsewhere))
                }
                Err(other) => panic!("{s}: {other:?}"),
            }
        }
        for &id in &idle {
            assert_eq!(a.locate(id).await.unwrap(), Whereabouts::Released, "{id}");
            let detail = a.session_detail(id).await.unwrap();
            assert_eq!(causes(&detail).last().map(String::as_str), Some("handoff"));
        }
        assert_ne!(a.locate(running).await.unwrap(), Whereabouts::Released);
        assert_ne!(a.locate(elsewhere).await.unwrap(), Whereabouts::Released);
        // Adopted as one released alone is, its holds with it.
        let adopted = other.adopt(node_b, idle[0], now()).await.unwrap();
        assert_eq!(adopted.holds, held);
        assert_eq!(adopted.turns, 1);
    });
}
