//! The finalize latch (G2) and memory from completed turns only (G7).

use crate::common::{rt, Backend, TestDb};
use crate::{append_all, now, open, owner, session, texts, write, HOUR};
use settle_store::{
    EndReason, FinalizeRequest, FinalizeStep, Finalized, NewSession, Outcome, State,
};

// --- finalize (G2, G7) -----------------------------------------------------------

pub(crate) fn g2_finalize_latch_wins_once_across_stores(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let rt = rt();
    let (one, two) = (open(&db), open(&db));
    rt.block_on(async {
        let o = owner(&*one, HOUR).await;
        let mut ids = Vec::new();
        for i in 0..40 {
            let id = write::register(&*one, NewSession::new(format!("s{i}"), o))
                .await
                .unwrap();
            ids.push(id);
        }
        for &id in &ids {
            let a = {
                let s = one.clone();
                tokio::spawn(async move {
                    write::finalize(
                        &*s,
                        id,
                        FinalizeRequest::new(EndReason::Shutdown).commit_memory(true),
                    )
                    .await
                })
            };
            let b = {
                let s = two.clone();
                tokio::spawn(async move {
                    write::finalize(
                        &*s,
                        id,
                        FinalizeRequest::new(EndReason::UserClose).commit_memory(true),
                    )
                    .await
                })
            };
            let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
            assert!(a.won() ^ b.won(), "session {id}: {a:?} / {b:?}");
            let detail = two.session_detail(id).await.unwrap();
            let finals = detail
                .timeline
                .iter()
                .filter(|t| t.to == State::Finalized)
                .count();
            assert_eq!(finals, 1);
            let expected = if a.won() {
                EndReason::Shutdown
            } else {
                EndReason::UserClose
            };
            assert_eq!(detail.session.end_reason, Some(expected));
        }
    });
}

pub(crate) fn g7_memory_only_from_completed_turns(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (o, id) = session(&*store, "s").await;
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 1, &["port 22 ", "open"]).await;
        write::end_turn(&*store, id, 1, Outcome::Completed, None, now())
            .await
            .unwrap();
        write::start_turn(&*store, id, 2, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 2, &["half a ans"]).await;
        write::end_turn(&*store, id, 2, Outcome::Failed, None, now())
            .await
            .unwrap();
        write::start_turn(&*store, id, 3, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 3, &["cut mid-"]).await;
        write::end_turn(&*store, id, 3, Outcome::Cancelled, None, now())
            .await
            .unwrap();
        write::start_turn(&*store, id, 4, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 4, &["still streaming"]).await;

        let Finalized::Won(report) = write::finalize(
            &*store,
            id,
            FinalizeRequest::new(EndReason::Shutdown).commit_memory(true),
        )
        .await
        .unwrap() else {
            panic!("must win")
        };
        assert_eq!(report.memories, 1);
        assert_eq!(report.interrupted_turn, Some(4));
        assert!(report.failed_steps.is_empty());
        let memories = store.memories(id).await.unwrap();
        assert_eq!(memories.len(), 1);
        assert_eq!(
            (memories[0].turn, memories[0].content.as_str()),
            (1, "port 22 open")
        );
        let detail = store.session_detail(id).await.unwrap();
        assert_eq!(detail.session.outcome, Some(Outcome::Interrupted));
        // The transcript is intact, interrupted turn included.
        assert_eq!(texts(&detail.turns[3]), vec!["still streaming"]);

        // Without commit_memory, nothing is committed.
        let other = write::register(&*store, NewSession::new("t", o))
            .await
            .unwrap();
        write::start_turn(&*store, other, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, other, 1, &["done"]).await;
        write::end_turn(&*store, other, 1, Outcome::Completed, None, now())
            .await
            .unwrap();
        let Finalized::Won(report) = write::finalize(
            &*store,
            other,
            FinalizeRequest::new(EndReason::Completed).with_outcome(Outcome::Completed),
        )
        .await
        .unwrap() else {
            panic!("must win")
        };
        assert_eq!(report.memories, 0);
        assert!(store.memories(other).await.unwrap().is_empty());
    });
}

pub(crate) fn a_failed_finalize_step_is_reported_and_recorded(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    let store = open(&db);
    let event = "BEFORE INSERT ON memories";
    crate::failing_trigger(&db, b, "memory_full", event, "memory is full");
    rt().block_on(async {
        let (_, id) = session(&*store, "s").await;
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        append_all(&*store, id, 1, &["x"]).await;
        write::end_turn(&*store, id, 1, Outcome::Completed, None, now())
            .await
            .unwrap();
        let Finalized::Won(report) = write::finalize(
            &*store,
            id,
            FinalizeRequest::new(EndReason::Completed).commit_memory(true),
        )
        .await
        .unwrap() else {
            panic!("must win")
        };
        assert_eq!(report.failed_steps.len(), 1);
        assert_eq!(report.failed_steps[0].step, FinalizeStep::CommitMemory);
        assert!(report.failed_steps[0]
            .error
            .to_string()
            .contains("memory is full"));
        let detail = store.session_detail(id).await.unwrap();
        assert_eq!(
            detail.session.state,
            State::Finalized,
            "the rest of the plan still ran"
        );
        let errors = detail.finalize_errors.unwrap();
        assert!(
            errors.contains("commit_memory") && errors.contains("memory is full"),
            "{errors}"
        );
        assert!(store.memories(id).await.unwrap().is_empty());
    });
}
