//! Sessions, transitions, turns and chunks (G10), and sessions marked closing.

use settle_core::CancelMode;
use settle_store::{
    Cause, EndReason, FinalizeRequest, Finalized, NewSession, Outcome, OwnerId, SessionFilter,
    SessionId, SessionStore, State, StoreError, StoreOptions,
};

use crate::common::{rt, Backend, TestDb};
use crate::{append_all, now, open, session, texts, write};

// --- sessions, transitions --------------------------------------------------

pub(crate) fn sessions_form_trees_under_open_parents(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (o, root) = session(&*store, "root").await;
        let child = write::register(&*store, NewSession::new("child", o).with_parent(root))
            .await
            .unwrap();
        assert_ne!(root, child);
        let rows = store
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap();
        assert_eq!(rows[1].parent, Some(root));
        assert_eq!(rows[0].parent, None);

        let missing = SessionId(999_999);
        let err = write::register(&*store, NewSession::new("orphan", o).with_parent(missing))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::UnknownSession(m) if m == missing),
            "{err:?}"
        );

        let err = write::register(&*store, NewSession::new("nobody's", OwnerId(424_242)))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::UnknownOwner(_)), "{err:?}");

        write::transition(
            &*store,
            child,
            State::Registered,
            State::Settled,
            Cause::AgentFinished,
            now(),
        )
        .await
        .unwrap();
        let err = write::register(&*store, NewSession::new("late", o).with_parent(child))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::ParentClosed {
                    state: State::Settled,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(
            write::finalize(&*store, child, FinalizeRequest::new(EndReason::Completed))
                .await
                .unwrap()
                .won()
        );
        let err = write::register(&*store, NewSession::new("later", o).with_parent(child))
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::ParentClosed {
                    state: State::Finalized,
                    ..
                }
            ),
            "{err:?}"
        );
    });
}

pub(crate) fn transition_is_conditional_and_recorded(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        let start = || {
            let (from, to) = (State::Registered, State::Running);
            write::transition(&*store, id, from, to, Cause::TurnStarted, now())
        };
        start().await.unwrap();
        let err = start().await.unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::StateMismatch {
                    expected: State::Registered,
                    found: State::Running,
                    ..
                }
            ),
            "{err:?}"
        );
        let msg = err.to_string();
        assert!(
            msg.contains("registered") && msg.contains("running"),
            "{msg}"
        );

        for (from, to) in [
            (State::Running, State::Finalized),
            (State::Settled, State::Running),
            (State::Cancelling, State::Registered),
        ] {
            let err = write::transition(&*store, id, from, to, Cause::AgentFinished, now())
                .await
                .unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidTransition { .. }),
                "{err:?}"
            );
        }
        write::transition(
            &*store,
            id,
            State::Running,
            State::Registered,
            Cause::TurnEnded(Outcome::Completed),
            now(),
        )
        .await
        .unwrap();
        let err = write::transition(
            &*store,
            SessionId(777_777),
            State::Registered,
            State::Running,
            Cause::TurnStarted,
            now(),
        )
        .await
        .unwrap_err();
        assert!(matches!(err, StoreError::UnknownSession(_)), "{err:?}");

        let detail = store.session_detail(id).await.unwrap();
        let steps: Vec<_> = detail
            .timeline
            .iter()
            .map(|t| (t.from, t.to, t.cause.as_str()))
            .collect();
        assert_eq!(
            steps,
            vec![
                (None, State::Registered, "registered"),
                (Some(State::Registered), State::Running, "turn started"),
                (
                    Some(State::Running),
                    State::Registered,
                    "turn ended: completed"
                ),
            ]
        );
        assert_eq!(detail.session.state, State::Registered);
    });
}

// --- turns, chunks -------------------------------------------------------------

/// Sessions "a", with turn 1 open, and "c", with turn `c_turn` open.
async fn two_open_turns(store: &dyn SessionStore, c_turn: u32) -> (SessionId, SessionId) {
    let (_, a) = session(store, "a").await;
    let (_, c) = session(store, "c").await;
    write::start_turn(store, a, 1, None, now()).await.unwrap();
    write::start_turn(store, c, c_turn, None, now())
        .await
        .unwrap();
    (a, c)
}

pub(crate) fn chunks_keep_append_order_per_turn(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = db.open_with(StoreOptions::default().with_batch_size(16));
        let (a, c) = two_open_turns(&*store, 7).await;
        // Interleave two turns; queue everything before awaiting anything.
        let mut receipts = Vec::new();
        for i in 0..300 {
            receipts.push((a, 1, i, store.append_chunk(a, 1, format!("a{i}").into())));
            receipts.push((c, 7, i, store.append_chunk(c, 7, format!("c{i}").into())));
        }
        for (id, turn, i, r) in receipts {
            let ack = r.await.unwrap();
            assert_eq!((ack.session, ack.turn, ack.seq), (id, turn, i));
        }
        let detail = store.session_detail(a).await.unwrap();
        let expected: Vec<String> = (0..300).map(|i| format!("a{i}")).collect();
        assert_eq!(texts(&detail.turns[0]), expected);
        assert_eq!(detail.session.chunks, 300);
        let turn_c = &store.session_detail(c).await.unwrap().turns[0];
        assert_eq!(turn_c.no, 7);
        assert_eq!(turn_c.chunks[299].text, "c299");
    });
}

/// A NUL character in a chunk's text (a provider's reply, a tool's output
/// echoed) is kept with the chunks around it: as it is on SQLite, as
/// U+FFFD on PostgreSQL, whose text never holds one (it refused the whole
/// batch, other sessions' chunks with it, and every retry of it). (A name
/// holding one the runtime refuses before the store.)
pub(crate) fn a_nul_in_a_chunks_text_is_kept_with_its_batch(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = db.open_with(StoreOptions::default().with_batch_size(16));
        let (a, c) = two_open_turns(&*store, 1).await;
        let receipts = vec![
            store.append_chunk(a, 1, "before ".to_owned().into()),
            store.append_chunk(c, 1, "other".to_owned().into()),
            store.append_chunk(a, 1, "a\0b".to_owned().into()),
            store.append_chunk(a, 1, " after".to_owned().into()),
        ];
        for r in receipts {
            r.await.expect("every chunk of the batch is kept");
        }
        let kept = match b {
            Backend::Postgres => "a\u{fffd}b",
            _ => "a\0b",
        };
        let detail = store.session_detail(a).await.unwrap();
        assert_eq!(texts(&detail.turns[0]), ["before ", kept, " after"]);
        assert_eq!(
            texts(&store.session_detail(c).await.unwrap().turns[0]),
            ["other"]
        );
    });
}

/// A turn's chunks are numbered on from its last one, by another store on
/// the same database too. On SQLite the number is read from the chunks
/// themselves and an append writes no turn row (a page of the write-ahead
/// log per commit); PostgreSQL claims it from the turn's `next_seq`.
pub(crate) fn chunk_numbers_continue_from_a_turns_last_chunk_in_every_store(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let id = rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "numbered").await;
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        assert_eq!(
            append_all(&*store, id, 1, &["a", "b", "c"]).await,
            [0, 1, 2]
        );
        id
    });
    rt().block_on(async {
        let again = open(&db);
        assert_eq!(append_all(&*again, id, 1, &["d", "e"]).await, [3, 4]);
        let detail = again.session_detail(id).await.unwrap();
        assert_eq!(texts(&detail.turns[0]), ["a", "b", "c", "d", "e"]);
    });
    let next_seq = db.query_i64("SELECT next_seq AS value FROM turns");
    match b {
        Backend::Sqlite => assert_eq!(next_seq, 0, "an append rewrote the turn's row"),
        _ => assert_eq!(next_seq, 5),
    }
}

pub(crate) fn g10_a_closed_turn_refuses_its_chunks_and_not_those_batched_with_it(b: Backend) {
    refused_turns_batched_with_open_ones(b, 2);
}

/// As above with twelve turns in a batch (the store claimed the numbers of
/// more than eight in one statement until SQLite took them from each turn's
/// chunks), and a finalized session among them.
pub(crate) fn g10_a_batch_of_many_turns_refuses_the_closed_ones_and_not_the_rest(b: Backend) {
    refused_turns_batched_with_open_ones(b, 12);
}

/// `open` sessions with an open turn, one whose turn ended and one that is
/// finalized, their chunks queued round-robin before any is awaited so that
/// every batch mixes them all: each open turn gets its chunks in order, the
/// other two get their refusals, and none of theirs is written.
fn refused_turns_batched_with_open_ones(b: Backend, open: usize) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = db.open_with(StoreOptions::default().with_batch_size(64));
        let mut live = Vec::new();
        for i in 0..open {
            live.push(session(&*store, &format!("open {i}")).await.1);
        }
        let (_, closed) = session(&*store, "closed").await;
        let (_, finalized) = session(&*store, "finalized").await;
        for &id in live.iter().chain([&closed, &finalized]) {
            write::start_turn(&*store, id, 1, None, now())
                .await
                .unwrap();
        }
        write::end_turn(&*store, closed, 1, Outcome::Completed, None, now())
            .await
            .unwrap();
        let won = write::finalize(
            &*store,
            finalized,
            FinalizeRequest::new(EndReason::UserClose),
        )
        .await
        .unwrap();
        assert!(matches!(won, Finalized::Won(_)), "{won:?}");
        let mut receipts = Vec::new();
        for i in 0..40 {
            for &id in live.iter().chain([&closed, &finalized]) {
                receipts.push((id, i, store.append_chunk(id, 1, format!("{i}").into())));
            }
        }
        for (id, i, r) in receipts {
            if id == closed {
                let err = r.await.unwrap_err();
                assert!(
                    matches!(err, StoreError::TurnClosed { turn: 1, .. }),
                    "{err:?}"
                );
            } else if id == finalized {
                let err = r.await.unwrap_err();
                assert!(
                    matches!(err, StoreError::SessionClosed(s) if s == finalized),
                    "{err:?}"
                );
            } else {
                let ack = r.await.unwrap();
                assert_eq!((ack.session, ack.turn, ack.seq), (id, 1, i));
            }
        }
        let expected: Vec<String> = (0..40).map(|i| format!("{i}")).collect();
        for &id in &live {
            assert_eq!(
                texts(&store.session_detail(id).await.unwrap().turns[0]),
                expected
            );
        }
        for id in [closed, finalized] {
            assert_eq!(store.session_detail(id).await.unwrap().session.chunks, 0);
        }
    });
}

pub(crate) fn g10_turn_closed_after_end_turn(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        let err = store.append_chunk(id, 1, "early".into()).await.unwrap_err();
        assert!(
            matches!(err, StoreError::UnknownTurn { turn: 1, .. }),
            "{err:?}"
        );

        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        let err = write::start_turn(&*store, id, 2, None, now())
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::TurnInFlight { open: 1, .. }),
            "{err:?}"
        );
        append_all(&*store, id, 1, &["kept"]).await;
        // Queued before end_turn, so committed before it.
        let before = store.append_chunk(id, 1, "just in time".into());
        write::end_turn(&*store, id, 1, Outcome::Detached, None, now())
            .await
            .unwrap();
        assert_eq!(before.await.unwrap().seq, 1);

        let err = store
            .append_chunk(id, 1, "too late".into())
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::TurnClosed { turn: 1, .. }),
            "{err:?}"
        );
        assert!(err.to_string().contains("revoked"), "{err}");
        let err = write::end_turn(&*store, id, 1, Outcome::Completed, None, now())
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::TurnClosed { .. }), "{err:?}");
        let err = write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::TurnExists { turn: 1, .. }),
            "{err:?}"
        );

        // A new turn is writable; the old one stays closed.
        write::start_turn(&*store, id, 2, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 2, &["next"]).await;
        let detail = store.session_detail(id).await.unwrap();
        assert_eq!(texts(&detail.turns[0]), vec!["kept", "just in time"]);
        assert_eq!(detail.turns[0].outcome, Some(Outcome::Detached));
        assert_eq!(texts(&detail.turns[1]), vec!["next"]);
        assert_eq!(detail.turns[1].outcome, None);
    });
}

pub(crate) fn g10_session_closed_after_finalize(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 1, &["one"]).await;
        write::end_turn(&*store, id, 1, Outcome::Completed, None, now())
            .await
            .unwrap();
        write::start_turn(&*store, id, 2, None, now())
            .await
            .unwrap();
        let won = write::finalize(&*store, id, FinalizeRequest::new(EndReason::UserClose))
            .await
            .unwrap();
        let Finalized::Won(report) = won else {
            panic!("first finalize must win")
        };
        assert_eq!(report.interrupted_turn, Some(2));
        let before = store.session_detail(id).await.unwrap();

        let closed = |r: Result<(), StoreError>| {
            let err = r.unwrap_err();
            assert!(
                matches!(err, StoreError::SessionClosed(s) if s == id),
                "{err:?}"
            );
            assert!(err.to_string().contains("finalized"), "{err}");
        };
        closed(store.append_chunk(id, 2, "ghost".into()).await.map(|_| ()));
        closed(store.append_chunk(id, 1, "ghost".into()).await.map(|_| ()));
        closed(write::start_turn(&*store, id, 3, None, now()).await);
        closed(write::end_turn(&*store, id, 2, Outcome::Completed, None, now()).await);
        closed(
            write::transition(
                &*store,
                id,
                State::Registered,
                State::Running,
                Cause::TurnStarted,
                now(),
            )
            .await,
        );
        assert!(matches!(
            write::finalize(&*store, id, FinalizeRequest::new(EndReason::Shutdown))
                .await
                .unwrap(),
            Finalized::AlreadyFinalized
        ));
        let after = store.session_detail(id).await.unwrap();
        assert_eq!(before, after, "refused writes changed the row");
        assert_eq!(after.session.end_reason, Some(EndReason::UserClose));
        assert_eq!(after.turns[1].outcome, Some(Outcome::Interrupted));
    });
}

// --- sessions marked closing ------------------------------------------------------

/// A session an earlier version claimed for a reclaim, its row marked closing
/// in the database, admits no new turn, and is finalized as any other. (The
/// claim itself is the core's now, G3; the store keeps the mark's rule.)
pub(crate) fn a_session_marked_closing_admits_no_new_turn(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        db.execute(&format!(
            "UPDATE sessions SET closing_reason = '{}' WHERE id = {id}",
            EndReason::IdleReap.as_str()
        ));
        let err = write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::SessionClosing {
                    reason: EndReason::IdleReap,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(store.session_detail(id).await.unwrap().turns.is_empty());
        assert!(
            write::finalize(&*store, id, FinalizeRequest::new(EndReason::IdleReap))
                .await
                .unwrap()
                .won()
        );
    });
}

/// Every refusal names its reason, the same on every backend: unknown
/// sessions and turns, states that admit no turn, moves the lifecycle lacks.
pub(crate) fn every_refusal_names_its_reason(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        let ghost = SessionId(424_242);
        let unknown = |r: Result<(), StoreError>| {
            assert!(
                matches!(r, Err(StoreError::UnknownSession(s)) if s == ghost),
                "{r:?}"
            )
        };
        unknown(write::start_turn(&*store, ghost, 1, None, now()).await);
        unknown(write::end_turn(&*store, ghost, 1, Outcome::Completed, None, now()).await);
        unknown(store.append_chunk(ghost, 1, "x".into()).await.map(|_| ()));
        unknown(
            write::finalize(&*store, ghost, FinalizeRequest::new(EndReason::Shutdown))
                .await
                .map(|_| ()),
        );
        unknown(store.session_detail(ghost).await.map(|_| ()));
        assert!(store.memories(ghost).await.unwrap().is_empty());

        let err = write::end_turn(&*store, id, 9, Outcome::Completed, None, now())
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::UnknownTurn { turn: 9, .. }),
            "{err:?}"
        );
        for state in [State::Registered, State::Settled] {
            let err = write::transition(&*store, id, state, state, Cause::AgentFinished, now())
                .await
                .unwrap_err();
            assert!(
                matches!(err, StoreError::InvalidTransition { .. }),
                "{err:?}"
            );
        }
        for (from, to, cause) in [
            (State::Registered, State::Running, Cause::TurnStarted),
            (
                State::Running,
                State::Cancelling,
                Cause::CancelRequested(CancelMode::Graceful),
            ),
        ] {
            write::transition(&*store, id, from, to, cause, now())
                .await
                .unwrap();
        }
        let err = write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StoreError::NotAcceptingTurns {
                    state: State::Cancelling,
                    ..
                }
            ),
            "{err:?}"
        );
        write::transition(
            &*store,
            id,
            State::Cancelling,
            State::Settled,
            Cause::TurnEnded(Outcome::Cancelled),
            now(),
        )
        .await
        .unwrap();
        let Finalized::Won(report) =
            write::finalize(&*store, id, FinalizeRequest::new(EndReason::Cancelled))
                .await
                .unwrap()
        else {
            panic!("must win")
        };
        assert_eq!((report.interrupted_turn, report.memories), (None, 0));
        let row = store.session_detail(id).await.unwrap().session;
        assert_eq!((row.state, row.outcome), (State::Finalized, None));
    });
}
