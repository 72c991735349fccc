//! Lifecycle writes group-committed: one transaction per batch, one answer per
//! write, the lifecycle's rules write by write, and the latch still spent
//! once (G2).

use std::task::{Context, Poll, Waker};
use std::time::Duration;

use serde_json::json;
use settle_core::CancelMode;
use settle_store::{
    Applied, Cause, EndReason, FinalizeRequest, Finalized, LifecycleWrite, NewSession, Outcome,
    OwnerId, SessionFilter, SessionId, SessionStore, State, StoreError, TimelineStep, TurnEnding,
    TurnError, TurnErrorKind, TurnInput,
};

use crate::common::{rt, Backend, TestDb};
use crate::{append_all, now, open, owner, session, write, HOUR};

fn transition(session: SessionId, from: State, to: State, cause: Cause) -> LifecycleWrite {
    LifecycleWrite::Transition {
        session,
        from,
        to,
        cause,
        at: now(),
    }
}

fn start(session: SessionId, no: u32) -> LifecycleWrite {
    LifecycleWrite::StartTurn {
        session,
        no,
        input: None,
        at: now(),
    }
}

fn end(session: SessionId, no: u32, outcome: Outcome) -> LifecycleWrite {
    LifecycleWrite::EndTurn {
        session,
        no,
        outcome,
        error: None,
        at: now(),
    }
}

fn finalize(session: SessionId, reason: EndReason) -> LifecycleWrite {
    LifecycleWrite::Finalize {
        session,
        plan: FinalizeRequest::new(reason).commit_memory(true),
    }
}

/// The teardown of one session mid-turn, as a batch carries it.
fn teardown(id: SessionId) -> Vec<LifecycleWrite> {
    vec![
        transition(
            id,
            State::Running,
            State::Cancelling,
            Cause::CancelRequested(CancelMode::Immediate),
        ),
        end(id, 1, Outcome::Cancelled),
        transition(
            id,
            State::Cancelling,
            State::Settled,
            Cause::TurnEnded(Outcome::Cancelled),
        ),
        finalize(id, EndReason::Cancelled),
    ]
}

/// A session running turn 1, with one chunk in it.
async fn running(store: &dyn SessionStore, owner: OwnerId, name: &str) -> SessionId {
    let id = write::register(store, NewSession::new(name, owner))
        .await
        .unwrap();
    let results = store
        .apply(vec![
            start(id, 1),
            transition(id, State::Registered, State::Running, Cause::TurnStarted),
        ])
        .await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    append_all(store, id, 1, &["partial"]).await;
    id
}

fn won(result: &Result<Applied, StoreError>) -> bool {
    matches!(result, Ok(Applied::Finalized(Finalized::Won(_))))
}

/// The order the kernel's recorder relies on when it hands the store a batch
/// while another is being applied (`SessionStore::applies_in_order`):
/// batches are applied in the order their `apply` futures are first polled,
/// not the order they were created or awaited in. Two batches finalize the
/// same session; the one polled first wins, the other finds the latch spent.
pub(crate) fn batches_are_applied_in_the_order_first_polled(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        assert!(store.applies_in_order());
        let o = owner(&*store, HOUR).await;
        let id = running(&*store, o, "a").await;

        let made_first = store.apply(vec![finalize(id, EndReason::UserClose)]);
        let mut polled_first = store.apply(vec![finalize(id, EndReason::Cancelled)]);
        let mut quiet = Context::from_waker(Waker::noop());
        let early = polled_first.as_mut().poll(&mut quiet);
        let second = made_first.await;
        let first = match early {
            Poll::Ready(results) => results,
            Poll::Pending => polled_first.await,
        };
        assert!(won(&first[0]), "{first:?}");
        assert!(
            matches!(
                second[0],
                Ok(Applied::Finalized(Finalized::AlreadyFinalized))
            ),
            "{second:?}"
        );
        let row = store.session_detail(id).await.unwrap().session;
        assert_eq!(row.end_reason, Some(EndReason::Cancelled));
    });
}

/// A batch tears three sessions down; another store finalized the middle one
/// first, so that session's finalize loses the race. Its writes are refused
/// one by one, the other two sessions are torn down whole, and every session
/// is finalized exactly once.
pub(crate) fn g2_a_finalize_that_loses_its_race_does_not_fail_the_batch(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let (mine, theirs) = (open(&db), open(&db));
        let o = owner(&*mine, HOUR).await;
        let ids = [
            running(&*mine, o, "a").await,
            running(&*mine, o, "b").await,
            running(&*mine, o, "c").await,
        ];
        assert!(
            write::finalize(&*theirs, ids[1], FinalizeRequest::new(EndReason::Recovered))
                .await
                .unwrap()
                .won()
        );

        let batch: Vec<_> = ids.iter().flat_map(|&id| teardown(id)).collect();
        let results = mine.apply(batch).await;
        assert_eq!(results.len(), 12);
        for (k, id) in ids.iter().enumerate() {
            let r = &results[4 * k..4 * k + 4];
            if k == 1 {
                for refused in &r[..3] {
                    assert!(
                        matches!(refused, Err(StoreError::SessionClosed(s)) if s == id),
                        "{refused:?}"
                    );
                }
                assert!(
                    matches!(r[3], Ok(Applied::Finalized(Finalized::AlreadyFinalized))),
                    "{:?}",
                    r[3]
                );
            } else {
                assert!(
                    r[..3].iter().all(|x| matches!(x, Ok(Applied::Done))),
                    "{r:?}"
                );
                assert!(won(&r[3]), "{:?}", r[3]);
            }
        }
        for (k, &id) in ids.iter().enumerate() {
            let d = mine.session_detail(id).await.unwrap();
            let finals = d.timeline.iter().filter(|t| t.to == State::Finalized);
            assert_eq!(finals.count(), 1, "session {id} finalized once");
            assert_eq!(d.session.state, State::Finalized);
            if k == 1 {
                assert_eq!(d.session.end_reason, Some(EndReason::Recovered));
                assert_eq!(d.turns[0].outcome, Some(Outcome::Interrupted));
                continue;
            }
            assert_eq!(d.session.end_reason, Some(EndReason::Cancelled));
            assert_eq!(d.session.outcome, Some(Outcome::Cancelled));
            assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled));
            let steps: Vec<_> = d
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
                        State::Cancelling,
                        "cancel requested (immediate)"
                    ),
                    (
                        Some(State::Cancelling),
                        State::Settled,
                        "turn ended: cancelled"
                    ),
                    (
                        Some(State::Settled),
                        State::Finalized,
                        "finalized: cancelled"
                    ),
                ]
            );
            // G7: no memory from a cancelled turn.
            assert!(mine.memories(id).await.unwrap().is_empty());
        }
    });
}

/// Within a batch, each write meets the session as the writes before it left
/// it, and is refused for the reason that write would get alone.
pub(crate) fn batch_writes_meet_the_session_the_writes_before_left(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        let input = json!([{"role": "user", "content": "hi"}]);
        let error = TurnError::new(TurnErrorKind::Timeout, "no event for 30s");
        let batch = vec![
            LifecycleWrite::StartTurn {
                session: id,
                no: 1,
                input: Some(TurnInput::whole(input.clone())),
                at: now(),
            },
            start(id, 2),
            end(id, 5, Outcome::Completed),
            transition(id, State::Registered, State::Running, Cause::TurnStarted),
            LifecycleWrite::EndTurn {
                session: id,
                no: 1,
                outcome: Outcome::IdleTimeout,
                error: Some(error.clone()),
                at: now(),
            },
            end(id, 1, Outcome::Completed),
            transition(id, State::Running, State::Finalized, Cause::AgentFinished),
            transition(id, State::Registered, State::Running, Cause::TurnStarted),
            transition(
                id,
                State::Running,
                State::Registered,
                Cause::TurnEnded(Outcome::IdleTimeout),
            ),
            start(id, 1),
            start(id, 2),
            finalize(id, EndReason::Failed),
            start(id, 3),
            finalize(id, EndReason::Completed),
            transition(
                SessionId(909_090),
                State::Registered,
                State::Running,
                Cause::TurnStarted,
            ),
        ];
        let r = store.apply(batch).await;
        let ok = |k: usize| assert!(matches!(r[k], Ok(Applied::Done)), "{k}: {:?}", r[k]);
        ok(0);
        assert!(
            matches!(r[1], Err(StoreError::TurnInFlight { open: 1, .. })),
            "{:?}",
            r[1]
        );
        assert!(
            matches!(r[2], Err(StoreError::UnknownTurn { turn: 5, .. })),
            "{:?}",
            r[2]
        );
        ok(3);
        ok(4);
        assert!(
            matches!(r[5], Err(StoreError::TurnClosed { turn: 1, .. })),
            "{:?}",
            r[5]
        );
        assert!(
            matches!(r[6], Err(StoreError::InvalidTransition { .. })),
            "{:?}",
            r[6]
        );
        assert!(
            matches!(
                r[7],
                Err(StoreError::StateMismatch {
                    expected: State::Registered,
                    found: State::Running,
                    ..
                })
            ),
            "{:?}",
            r[7]
        );
        ok(8);
        assert!(
            matches!(r[9], Err(StoreError::TurnExists { turn: 1, .. })),
            "{:?}",
            r[9]
        );
        ok(10);
        // Turn 2 is open: the finalize interrupts it.
        match &r[11] {
            Ok(Applied::Finalized(Finalized::Won(report))) => {
                assert_eq!(report.interrupted_turn, Some(2));
                assert_eq!(report.memories, 0);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            matches!(r[12], Err(StoreError::SessionClosed(s)) if s == id),
            "{:?}",
            r[12]
        );
        assert!(
            matches!(r[13], Ok(Applied::Finalized(Finalized::AlreadyFinalized))),
            "{:?}",
            r[13]
        );
        assert!(
            matches!(r[14], Err(StoreError::UnknownSession(_))),
            "{:?}",
            r[14]
        );

        let d = store.session_detail(id).await.unwrap();
        assert_eq!(d.session.state, State::Finalized);
        assert_eq!(d.session.end_reason, Some(EndReason::Failed));
        assert_eq!(d.session.outcome, Some(Outcome::Interrupted));
        let turns: Vec<_> = d
            .turns
            .iter()
            .map(|t| (t.no, t.outcome, t.error.clone(), t.input.clone()))
            .collect();
        assert_eq!(
            turns,
            vec![
                (
                    1,
                    Some(Outcome::IdleTimeout),
                    Some(error),
                    Some(TurnInput::whole(input))
                ),
                (2, Some(Outcome::Interrupted), None, None),
            ]
        );
        let causes: Vec<_> = d.timeline.iter().map(|t| t.cause.as_str()).collect();
        assert_eq!(
            causes,
            [
                "registered",
                "turn started",
                "turn ended: idle_timeout",
                "finalized: failed"
            ]
        );
    });
}

/// Memory is committed in the latch's transaction from the turns completed
/// before it, including one completed earlier in the same batch (G7).
pub(crate) fn g7_a_batch_commits_memory_from_turns_it_completed(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 1, &["port 22 ", "open"]).await;
        let r = store
            .apply(vec![
                end(id, 1, Outcome::Completed),
                transition(id, State::Registered, State::Settled, Cause::AgentFinished),
                finalize(id, EndReason::Completed),
            ])
            .await;
        match &r[2] {
            Ok(Applied::Finalized(Finalized::Won(report))) => assert_eq!(report.memories, 1),
            other => panic!("{other:?}"),
        }
        let memories = store.memories(id).await.unwrap();
        assert_eq!(memories[0].content, "port 22 open");
    });
}

/// Registrations in a batch get ids in batch order, each refused alone when
/// its parent, owner or resumed session does not allow it.
pub(crate) fn batch_registrations_answer_ids_and_refuse_alone(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (o, root) = session(&*store, "root").await;
        let (_, closed) = session(&*store, "closed").await;
        assert!(
            write::finalize(&*store, closed, FinalizeRequest::new(EndReason::Completed))
                .await
                .unwrap()
                .won()
        );
        let ghost = SessionId(808_080);
        let r = store
            .apply(vec![
                LifecycleWrite::Register(NewSession::new("kid-1", o).with_parent(root)),
                LifecycleWrite::Register(NewSession::new("orphan", o).with_parent(closed)),
                LifecycleWrite::Register(NewSession::new("nobody's", OwnerId(99_999))),
                LifecycleWrite::Register(NewSession::new("nowhere", o).resuming(ghost)),
                LifecycleWrite::Register(NewSession::new("again", o).resuming(closed)),
                LifecycleWrite::Register(NewSession::new("kid-2", o).with_parent(root)),
                finalize(root, EndReason::Completed),
                LifecycleWrite::Register(NewSession::new("too late", o).with_parent(root)),
            ])
            .await;
        let id = |k: usize| match r[k] {
            Ok(Applied::Registered(id)) => id,
            ref other => panic!("{k}: {other:?}"),
        };
        let (kid1, again, kid2) = (id(0), id(4), id(5));
        assert!(
            closed < kid1 && kid1 < again && again < kid2,
            "ids in batch order"
        );
        assert!(
            matches!(
                r[1],
                Err(StoreError::ParentClosed {
                    state: State::Finalized,
                    ..
                })
            ),
            "{:?}",
            r[1]
        );
        assert!(
            matches!(r[2], Err(StoreError::UnknownOwner(_))),
            "{:?}",
            r[2]
        );
        assert!(
            matches!(r[3], Err(StoreError::UnknownSession(s)) if s == ghost),
            "{:?}",
            r[3]
        );
        assert!(won(&r[6]), "{:?}", r[6]);
        assert!(
            matches!(
                r[7],
                Err(StoreError::ParentClosed {
                    state: State::Finalized,
                    ..
                })
            ),
            "{:?}",
            r[7]
        );
        let rows = store
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap();
        let seen: Vec<_> = rows
            .iter()
            .map(|r| (r.id, r.name.as_str(), r.parent, r.resumed_from, r.state))
            .collect();
        assert_eq!(
            seen,
            vec![
                (root, "root", None, None, State::Finalized),
                (closed, "closed", None, None, State::Finalized),
                (kid1, "kid-1", Some(root), None, State::Registered),
                (again, "again", None, Some(closed), State::Registered),
                (kid2, "kid-2", Some(root), None, State::Registered),
            ]
        );
        let d = store.session_detail(kid2).await.unwrap();
        assert_eq!(d.timeline.len(), 1);
        assert_eq!(
            (
                d.timeline[0].from,
                d.timeline[0].to,
                d.timeline[0].cause.as_str()
            ),
            (None, State::Registered, "registered")
        );
        // Ids stay unique with registrations in later batches.
        let (_, next) = session(&*store, "next").await;
        assert!(next > kid2);
    });
}

/// When the transaction fails, nothing of the batch is written and every
/// write gets the database's error.
pub(crate) fn a_failed_batch_writes_nothing(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let store = open(&db);
    rt().block_on(async {
        let o = owner(&*store, HOUR).await;
        let id = running(&*store, o, "s").await;
        let before = store.session_detail(id).await.unwrap();
        let event = "BEFORE INSERT ON timeline";
        crate::failing_trigger(&db, b, "timeline_full", event, "timeline is full");
        let mut batch = teardown(id);
        batch.push(LifecycleWrite::Register(NewSession::new("new", o)));
        let results = store.apply(batch).await;
        assert_eq!(results.len(), 5);
        for r in &results {
            match r {
                Err(StoreError::Database { source, .. }) => {
                    assert!(source.to_string().contains("timeline is full"), "{source}")
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(store.session_detail(id).await.unwrap(), before);
        let all = store.list_sessions(SessionFilter::all()).await.unwrap();
        assert_eq!(all.len(), 1, "the registration was not written");
    });
}

/// PostgreSQL, two processes: another transaction is finalizing a session
/// (its row locked, not yet committed) when the batch reaches it. The batch
/// waits for that transaction, then finds the latch spent; the rest of the
/// batch goes through.
#[test]
fn g2_postgres_a_batch_waits_for_a_finalize_in_flight_and_loses_to_it() {
    use diesel::connection::SimpleConnection;
    use diesel::{Connection, RunQueryDsl};

    let Some(db) = TestDb::new(Backend::Postgres) else {
        return;
    };
    let store = open(&db);
    rt().block_on(async {
        let o = owner(&*store, HOUR).await;
        let (a, b) = (
            running(&*store, o, "a").await,
            running(&*store, o, "b").await,
        );

        let mut other = diesel::pg::PgConnection::establish(&db.url).unwrap();
        other
            .batch_execute(&format!(
                "BEGIN; \
                 UPDATE sessions SET state = 'finalized', end_reason = 'recovered', \
                   outcome = 'interrupted', open_turn = NULL, version = version + 1 \
                   WHERE id = {b}; \
                 UPDATE turns SET ended_at = 0, outcome = 'interrupted' \
                   WHERE session = {b} AND ended_at IS NULL; \
                 INSERT INTO timeline (session, steps) \
                   VALUES ({b}, '[[0, \"running\", \"finalized\", \"recovered: by hand\"]]');"
            ))
            .unwrap();
        let batch: Vec<_> = [a, b].into_iter().flat_map(teardown).collect();
        let applying = tokio::spawn({
            let store = store.clone();
            async move { store.apply(batch).await }
        });
        // Commit only once the batch is blocked on the locked row, so that it
        // must see the finalize after it read nothing of it.
        let mut probe = diesel::pg::PgConnection::establish(&db.url).unwrap();
        #[derive(diesel::QueryableByName)]
        struct Waiting {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        loop {
            let w: Waiting = diesel::sql_query(
                "SELECT count(*) AS n FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            )
            .get_result(&mut probe)
            .unwrap();
            if w.n > 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        other.batch_execute("COMMIT").unwrap();
        let results = applying.await.unwrap();
        assert!(results[..3].iter().all(|r| matches!(r, Ok(Applied::Done))));
        assert!(won(&results[3]), "{:?}", results[3]);
        assert!(results[4..7]
            .iter()
            .all(|r| matches!(r, Err(StoreError::SessionClosed(_)))));
        assert!(
            matches!(
                results[7],
                Ok(Applied::Finalized(Finalized::AlreadyFinalized))
            ),
            "{:?}",
            results[7]
        );
        let d = store.session_detail(b).await.unwrap();
        assert_eq!(d.session.end_reason, Some(EndReason::Recovered));
        assert_eq!(d.session.state, State::Finalized);
    });
}

/// A batch larger than one statement (600 sessions: two full statements,
/// the second reusing the first's prepared form, and a shorter one) is
/// applied whole, every write answered in order.
pub(crate) fn a_batch_larger_than_a_statement_is_applied_whole(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let o = owner(&*store, HOUR).await;
        let registered = store
            .apply(
                (0..600)
                    .map(|i| LifecycleWrite::Register(NewSession::new(format!("s{i}"), o)))
                    .collect(),
            )
            .await;
        let ids: Vec<SessionId> = registered
            .into_iter()
            .map(|r| match r {
                Ok(Applied::Registered(id)) => id,
                other => panic!("{other:?}"),
            })
            .collect();
        let started = store
            .apply(
                ids.iter()
                    .flat_map(|&id| {
                        [
                            start(id, 1),
                            transition(id, State::Registered, State::Running, Cause::TurnStarted),
                        ]
                    })
                    .collect(),
            )
            .await;
        assert!(started.iter().all(|r| matches!(r, Ok(Applied::Done))));
        let torn = store
            .apply(ids.iter().rev().flat_map(|&id| teardown(id)).collect())
            .await;
        assert_eq!(torn.len(), 2400);
        for (k, r) in torn.iter().enumerate() {
            if k % 4 == 3 {
                assert!(won(r), "{k}: {r:?}");
            } else {
                assert!(matches!(r, Ok(Applied::Done)), "{k}: {r:?}");
            }
        }
        for id in [ids[0], ids[255], ids[256], ids[599]] {
            let d = store.session_detail(id).await.unwrap();
            assert_eq!(d.session.state, State::Finalized);
            assert_eq!(d.turns[0].outcome, Some(Outcome::Cancelled));
            assert_eq!(d.timeline.len(), 5, "{:?}", d.timeline);
        }
    });
}

/// A session's end as one write: a finalize carrying the transitions and
/// the turn's end since the session's last write leaves the rows, the turn
/// and the timeline exactly as those writes one by one do, answered once;
/// what the lifecycle refuses of what it carries is reported with the
/// refusal the separate write would get, and the session is finalized all
/// the same (G2, G10).
pub(crate) fn a_finalize_carrying_its_steps_and_turn_end_writes_what_the_writes_one_by_one_do(
    b: Backend,
) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let o = owner(&*store, HOUR).await;
        let (apart, together) = (
            running(&*store, o, "apart").await,
            running(&*store, o, "together").await,
        );
        let results = store.apply(teardown(apart)).await;
        assert!(results[..3].iter().all(Result::is_ok), "{results:?}");
        assert!(won(&results[3]), "{results:?}");

        // The same four writes, carried by the finalize.
        let at = now();
        let step = |from, to, cause| TimelineStep {
            from,
            to,
            cause,
            at,
        };
        let plan = FinalizeRequest::new(EndReason::Cancelled)
            .commit_memory(true)
            .at(at)
            .after_steps([
                step(
                    State::Running,
                    State::Cancelling,
                    Cause::CancelRequested(CancelMode::Immediate),
                ),
                step(
                    State::Cancelling,
                    State::Settled,
                    Cause::TurnEnded(Outcome::Cancelled),
                ),
            ])
            .ending_turn(TurnEnding {
                no: 1,
                outcome: Outcome::Cancelled,
                error: None,
                at,
            });
        let report = won_alone(&*store, together, plan).await;
        assert!(report.refused.is_empty(), "{report:?}");
        assert_eq!(report.interrupted_turn, None, "its turn was ended first");
        let (a, t) = (
            store.session_detail(apart).await.unwrap(),
            store.session_detail(together).await.unwrap(),
        );
        assert_eq!(shape(&t), shape(&a));
        assert_eq!(t.turns[0].ended_at, Some(round_to_millis(at)));

        // What it carries and the lifecycle refuses is reported, each as its
        // own write would be answered; the finalize still wins.
        let third = running(&*store, o, "refused").await;
        let plan = FinalizeRequest::new(EndReason::UserClose)
            .after_steps([step(
                State::Cancelling,
                State::Settled,
                Cause::DescendantsSettled,
            )])
            .ending_turn(TurnEnding {
                no: 7,
                outcome: Outcome::Completed,
                error: None,
                at,
            });
        let report = won_alone(&*store, third, plan).await;
        assert!(
            matches!(
                &report.refused[..],
                [
                    StoreError::StateMismatch {
                        expected: State::Cancelling,
                        found: State::Running,
                        ..
                    },
                    StoreError::UnknownTurn { turn: 7, .. },
                ]
            ),
            "{:?}",
            report.refused
        );
        assert_eq!(report.interrupted_turn, Some(1), "turn 1 was still open");
        let d = store.session_detail(third).await.unwrap();
        assert_eq!(d.session.end_reason, Some(EndReason::UserClose));
        assert_eq!(d.turns[0].outcome, Some(Outcome::Interrupted));

        // A turn that ended already is refused as closed, as its own end
        // written twice would be.
        let fourth = running(&*store, o, "ended").await;
        let results = store.apply(vec![end(fourth, 1, Outcome::Completed)]).await;
        assert!(results[0].is_ok(), "{results:?}");
        let plan = FinalizeRequest::new(EndReason::Completed).ending_turn(TurnEnding {
            no: 1,
            outcome: Outcome::Cancelled,
            error: None,
            at,
        });
        let report = won_alone(&*store, fourth, plan).await;
        assert!(
            matches!(
                &report.refused[..],
                [StoreError::TurnClosed { turn: 1, .. }]
            ),
            "{:?}",
            report.refused
        );
        let d4 = store.session_detail(fourth).await.unwrap();
        assert_eq!(d4.turns[0].outcome, Some(Outcome::Completed));

        // A finalize that finds the latch spent writes nothing it carries.
        let again = FinalizeRequest::new(EndReason::Cancelled).after_steps([step(
            State::Finalized,
            State::Settled,
            Cause::DescendantsSettled,
        )]);
        let results = store
            .apply(vec![LifecycleWrite::Finalize {
                session: third,
                plan: again,
            }])
            .await;
        assert!(
            matches!(
                results[..],
                [Ok(Applied::Finalized(Finalized::AlreadyFinalized))]
            ),
            "{results:?}"
        );
        assert_eq!(
            store.session_detail(third).await.unwrap().timeline,
            d.timeline
        );
    });
}

/// Applies `plan` as `session`'s finalize alone; its report, once it won.
async fn won_alone(
    store: &dyn SessionStore,
    session: SessionId,
    plan: FinalizeRequest,
) -> settle_store::FinalizeReport {
    let results = store
        .apply(vec![LifecycleWrite::Finalize { session, plan }])
        .await;
    match &results[..] {
        [Ok(Applied::Finalized(Finalized::Won(report)))] => report.clone(),
        other => panic!("one answer, won: {other:?}"),
    }
}

/// `at` as the store keeps it: whole milliseconds.
fn round_to_millis(at: std::time::SystemTime) -> std::time::SystemTime {
    let since = at.duration_since(std::time::UNIX_EPOCH).unwrap();
    std::time::UNIX_EPOCH + Duration::from_millis(since.as_millis() as u64)
}

/// A session's end is its own row's write: a turn whose end its finalize
/// carried, ended at the finalize with the session's outcome and no error,
/// keeps no end in its row, and reads as ended, in the session's detail and
/// in a page of it, exactly as its own write would have left it. A turn
/// that failed with an error, or completed (memory is committed from the
/// turns whose rows say so, G7), has its row written as before.
pub(crate) fn a_turn_ended_by_its_finalize_reads_ended_without_its_own_row_write(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let o = owner(&*store, HOUR).await;
        let at = now();
        let carried = |outcome, error: Option<TurnError>, reason| {
            FinalizeRequest::new(reason)
                .commit_memory(outcome == Outcome::Completed)
                .with_outcome(outcome)
                .at(at)
                .ending_turn(TurnEnding {
                    no: 1,
                    outcome,
                    error,
                    at,
                })
        };
        let error = TurnError::new(TurnErrorKind::Timeout, "no event for 30s");
        let mut ids = Vec::new();
        for (name, outcome, error, reason) in [
            ("cancelled", Outcome::Cancelled, None, EndReason::Cancelled),
            ("failed", Outcome::Failed, Some(error), EndReason::Failed),
            ("completed", Outcome::Completed, None, EndReason::Completed),
        ] {
            let id = running(&*store, o, name).await;
            let plan = carried(outcome, error.clone(), reason);
            let results = store
                .apply(vec![LifecycleWrite::Finalize { session: id, plan }])
                .await;
            assert!(won(&results[0]), "{results:?}");
            ids.push((id, outcome, error));
        }
        // Only the cancelled turn's row went unwritten.
        assert_eq!(
            db.query_i64("SELECT COUNT(*) AS value FROM turns WHERE ended_at IS NULL"),
            1
        );
        for (id, outcome, error) in ids {
            let d = store.session_detail(id).await.unwrap();
            let turn = &d.turns[0];
            assert_eq!(turn.outcome, Some(outcome), "session {id}");
            assert_eq!(turn.error, error, "session {id}");
            // G7: the completed turn's reply is committed to memory.
            let memories = store.memories(id).await.unwrap().len();
            assert_eq!(memories, usize::from(outcome == Outcome::Completed));
            assert_eq!(turn.ended_at, Some(round_to_millis(at)), "session {id}");
            assert_eq!(turn.text(), "partial");
            let page = store.turn_page(id, None, 0, 10).await.unwrap();
            let paged = page.turn.expect("its turn");
            assert_eq!(
                (paged.outcome, paged.ended_at),
                (turn.outcome, turn.ended_at)
            );
            // A closed session refuses its turn's chunks as before (G10).
            let refused = store
                .append_chunk(id, 1, settle_store::NewChunk::text("late"))
                .await;
            assert!(
                matches!(refused, Err(StoreError::SessionClosed(s)) if s == id),
                "{refused:?}"
            );
        }
    });
}

/// The set-wise latch answers as the rules do. The same sessions, in every
/// shape a teardown's finalize may meet (running as its steps expect,
/// finalized already, in another state, another turn open, released to
/// another process, named by a second write of the batch, a failed turn
/// with its error), get the same batch of finalizes carrying their steps
/// and turn ends, once through `apply` (each row read and decided by the
/// rules) and once through `apply_as` (the finalizes whose rows are as they
/// expect spend the latch by their own conditional update, the rest are
/// read and decided): the answers and the rows left are the same (G2, G10).
pub(crate) fn g2_the_set_latch_answers_as_the_rules_do(b: Backend) {
    let mut seen = Vec::new();
    for through_the_set in [false, true] {
        let Some(db) = TestDb::new(b) else { return };
        seen.push(rt().block_on(async {
            let (store, theirs) = (open(&db), open(&db));
            let o = owner(&*store, HOUR).await;
            let at = now();
            let step = |from, to, cause| TimelineStep {
                from,
                to,
                cause,
                at,
            };
            let cancel = [
                step(
                    State::Running,
                    State::Cancelling,
                    Cause::AncestorWindingDown,
                ),
                step(
                    State::Cancelling,
                    State::Settled,
                    Cause::TurnEnded(Outcome::Cancelled),
                ),
            ];
            let ended = |no, outcome, error| TurnEnding {
                no,
                outcome,
                error,
                at,
            };
            let finalize = |id, steps: &[TimelineStep], end: Option<TurnEnding>| {
                let mut plan = FinalizeRequest::new(EndReason::ParentFinished)
                    .at(at)
                    .after_steps(steps.iter().copied());
                plan.turn_end = end;
                LifecycleWrite::Finalize { session: id, plan }
            };
            let mut batch = Vec::new();
            let mut ids = Vec::new();
            // As expected: the set decides it.
            let plain = running(&*store, o, "plain").await;
            batch.push(finalize(
                plain,
                &cancel,
                Some(ended(1, Outcome::Cancelled, None)),
            ));
            // Finalized already by another process.
            let gone = running(&*store, o, "gone").await;
            let lost = FinalizeRequest::new(EndReason::Recovered);
            assert!(write::finalize(&*theirs, gone, lost).await.unwrap().won());
            batch.push(finalize(
                gone,
                &cancel,
                Some(ended(1, Outcome::Cancelled, None)),
            ));
            // Its steps expect another state.
            let idle = write::register(&*store, NewSession::new("idle", o))
                .await
                .unwrap();
            batch.push(finalize(
                idle,
                &cancel,
                Some(ended(1, Outcome::Cancelled, None)),
            ));
            // Another turn open than the one its end names.
            let second = running(&*store, o, "second").await;
            let results = store
                .apply(vec![
                    end(second, 1, Outcome::Completed),
                    transition(
                        second,
                        State::Running,
                        State::Registered,
                        Cause::TurnEnded(Outcome::Completed),
                    ),
                    start(second, 2),
                    transition(
                        second,
                        State::Registered,
                        State::Running,
                        Cause::TurnStarted,
                    ),
                ])
                .await;
            assert!(results.iter().all(Result::is_ok), "{results:?}");
            batch.push(finalize(
                second,
                &cancel,
                Some(ended(1, Outcome::Cancelled, None)),
            ));
            // A failed turn, whose error its row keeps.
            let failed = running(&*store, o, "failed").await;
            let error = TurnError::new(TurnErrorKind::Connect, "connection refused");
            let failing = [
                cancel[0],
                step(
                    State::Cancelling,
                    State::Settled,
                    Cause::TurnEnded(Outcome::Failed),
                ),
            ];
            batch.push(finalize(
                failed,
                &failing,
                Some(ended(1, Outcome::Failed, Some(error))),
            ));
            // Named by a second write of the batch: decided by the rules.
            let twice = running(&*store, o, "twice").await;
            batch.push(transition(
                twice,
                State::Running,
                State::Cancelling,
                Cause::UserClose,
            ));
            batch.push(finalize(
                twice,
                &[step(
                    State::Cancelling,
                    State::Settled,
                    Cause::DescendantsSettled,
                )],
                Some(ended(1, Outcome::Cancelled, None)),
            ));
            // Nothing carried: decided by the rules.
            let bare = running(&*store, o, "bare").await;
            batch.push(finalize(bare, &[], None));
            ids.extend([plain, gone, idle, second, failed, twice, bare]);

            let answers = if through_the_set {
                store.apply_as(o, batch).await
            } else {
                store.apply(batch).await
            };
            let answers: Vec<String> = answers
                .iter()
                .map(|a| match a {
                    Ok(Applied::Finalized(Finalized::Won(r))) => {
                        format!("won {:?} {:?}", r.interrupted_turn, r.refused)
                    }
                    other => format!("{other:?}"),
                })
                .collect();
            let mut rows = Vec::new();
            for id in ids {
                let d = store.session_detail(id).await.unwrap();
                rows.push(format!(
                    "{} {:?}",
                    shape(&d),
                    d.session.finalized_at.is_some()
                ));
            }
            (answers, rows)
        }));
    }
    assert_eq!(seen[0].0, seen[1].0, "the answers");
    for (rules, set) in seen[0].1.iter().zip(&seen[1].1) {
        assert_eq!(rules, set);
    }
    // The case the set decides did win, whichever way.
    assert!(seen[1].0[0].starts_with("won None []"), "{:?}", seen[1].0);
}

/// What a session's row, turns, timeline and finalize errors say, times
/// left out but whether each turn ended: two ways of writing the same
/// lifecycle compare equal by it.
fn shape(d: &settle_store::SessionDetail) -> String {
    format!(
        "{:?} {:?} {:?} {:?}",
        (d.session.state, d.session.outcome, d.session.end_reason),
        d.turns
            .iter()
            .map(|t| (t.no, t.outcome, t.ended_at.is_some(), t.error.clone()))
            .collect::<Vec<_>>(),
        d.timeline
            .iter()
            .map(|s| (s.from, s.to, s.cause.clone()))
            .collect::<Vec<_>>(),
        d.finalize_errors,
    )
}

/// G1 and G7 in the store when a transaction fails while the next batch is
/// already handed (`SessionStore::apply_chained`): a child's finalize
/// fails (the database refuses its timeline segment, as a full disk or a
/// lock does), and its parent's, handed behind it before its failure was
/// answered, must not be committed ahead of it, even once the database
/// takes writes again. A chained batch is refused with the failure before
/// it, writing nothing, until a batch that is not chained (its caller has
/// seen every answer before it) starts the chain again.
pub(crate) fn g1_a_batch_chained_behind_one_that_failed_is_refused_until_one_that_is_not(
    b: Backend,
) {
    let Some(db) = TestDb::new(b) else { return };
    let store = open(&db);
    rt().block_on(async {
        let o = owner(&*store, HOUR).await;
        let parent = write::register(&*store, NewSession::new("parent", o))
            .await
            .unwrap();
        let mut child = NewSession::new("child", o);
        child.parent = Some(parent);
        let child = write::register(&*store, child).await.unwrap();
        let event = "BEFORE UPDATE ON sessions";
        crate::failing_trigger(&db, b, "disk_full", event, "the disk is full");
        let failed = store
            .apply_as(o, vec![finalize(child, EndReason::UserClose)])
            .await;
        assert!(
            matches!(&failed[0], Err(e @ StoreError::Database { .. }) if e.may_heal()),
            "{failed:?}"
        );
        // The database takes writes again before the batch behind it runs.
        crate::drop_failing_trigger(&db, b, "disk_full", "sessions");
        // Another kernel on the same store keeps a chain of its own: its
        // batch, not chained, does not start this writer's again.
        let other = owner(&*store, HOUR).await;
        let theirs = write::register(&*store, NewSession::new("theirs", other))
            .await
            .unwrap();
        let applied = store
            .apply_as(other, vec![finalize(theirs, EndReason::UserClose)])
            .await;
        assert!(won(&applied[0]), "{applied:?}");
        let behind = store
            .apply_chained(o, vec![finalize(parent, EndReason::UserClose)])
            .await;
        assert!(
            matches!(&behind[0], Err(e @ StoreError::Database { .. }) if e.may_heal() && e.to_string().contains("the disk is full")),
            "a batch chained behind a failed one was applied: {behind:?}"
        );
        let state = |id| {
            let store = store.clone();
            async move { store.session_detail(id).await.unwrap().session.state }
        };
        assert_eq!(state(parent).await, State::Registered);
        // Still broken for the next chained one, whatever it holds.
        let still = store
            .apply_chained(o, vec![finalize(parent, EndReason::UserClose)])
            .await;
        assert!(still[0].is_err(), "{still:?}");
        assert_eq!(state(parent).await, State::Registered);

        // The caller saw the failures and hands the writes again, in order,
        // not chained: applied; and a batch chained behind that one is too.
        let again = store
            .apply_as(o, vec![finalize(child, EndReason::UserClose)])
            .await;
        assert!(won(&again[0]), "{again:?}");
        let next = store
            .apply_chained(o, vec![finalize(parent, EndReason::UserClose)])
            .await;
        assert!(won(&next[0]), "{next:?}");
        assert_eq!(state(child).await, State::Finalized);
        assert_eq!(state(parent).await, State::Finalized);
    });
}
