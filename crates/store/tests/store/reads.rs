//! Flush, and the reads the command line prints.

use std::time::{Duration, UNIX_EPOCH};

use crate::common::{rt, Backend, TestDb};
use crate::{append_all, now, open, owner, session, texts, write, HOUR};
use settle_store::{
    EndReason, FinalizeRequest, ListCursor, NewSession, Outcome, SessionFilter, SessionId, State,
    StoreError,
};

// --- flush and reads ----------------------------------------------------------------

pub(crate) fn flush_waits_for_every_appended_chunk(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "s").await;
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        for i in 0..500 {
            // Nobody waits for these receipts: flush must cover them.
            drop(store.append_chunk(id, 1, format!("{i}").into()));
        }
        store.flush().await.unwrap();
        let other = store.clone();
        let detail = other.session_detail(id).await.unwrap();
        assert_eq!(detail.turns[0].chunks.len(), 500);
        assert_eq!(detail.turns[0].chunks[499].text, "499");
    });
}

pub(crate) fn lists_and_details_carry_the_cli_fields(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let t0 = UNIX_EPOCH + Duration::from_millis(1_700_000_000_123);
        let o = owner(&*store, HOUR).await;
        let root = write::register(&*store, NewSession::new("root", o).at(t0))
            .await
            .unwrap();
        let kid = write::register(&*store, NewSession::new("kid", o).with_parent(root).at(t0))
            .await
            .unwrap();
        for turn in 1..=2 {
            write::start_turn(&*store, kid, turn, None, t0)
                .await
                .unwrap();
            append_all(&*store, kid, turn, &["x", "y", "z"]).await;
            write::end_turn(&*store, kid, turn, Outcome::Completed, None, t0)
                .await
                .unwrap();
        }
        let t1 = t0 + Duration::from_secs(2);
        assert!(write::finalize(
            &*store,
            kid,
            FinalizeRequest::new(EndReason::Completed).at(t1)
        )
        .await
        .unwrap()
        .won());

        let all = store
            .list_sessions(SessionFilter::all().oldest_first())
            .await
            .unwrap();
        assert_eq!(all.len(), 2);
        let k = &all[1];
        assert_eq!(
            (
                k.id,
                k.name.as_str(),
                k.parent,
                k.state,
                k.outcome,
                k.end_reason,
                k.turns,
                k.chunks
            ),
            (
                kid,
                "kid",
                Some(root),
                State::Finalized,
                Some(Outcome::Completed),
                Some(EndReason::Completed),
                2,
                6
            )
        );
        assert_eq!((k.created_at, k.finalized_at), (t0, Some(t1)));
        let r = &all[0];
        assert_eq!(
            (r.state, r.outcome, r.end_reason, r.turns, r.chunks),
            (State::Registered, None, None, 0, 0)
        );
        assert_eq!(r.finalized_at, None);

        let finalized = store
            .list_sessions(
                SessionFilter::all()
                    .in_state(State::Finalized)
                    .oldest_first(),
            )
            .await
            .unwrap();
        assert_eq!(finalized, vec![k.clone()]);
        let registered = store
            .list_sessions(
                SessionFilter::all()
                    .in_state(State::Registered)
                    .oldest_first(),
            )
            .await
            .unwrap();
        assert_eq!(registered, vec![r.clone()]);

        let d = store.session_detail(kid).await.unwrap();
        assert_eq!(d.session, *k);
        assert_eq!(d.turns.len(), 2);
        assert_eq!(
            (
                d.turns[1].no,
                d.turns[1].outcome,
                d.turns[1].started_at,
                d.turns[1].ended_at
            ),
            (2, Some(Outcome::Completed), t0, Some(t0))
        );
        assert_eq!(texts(&d.turns[1]), vec!["x", "y", "z"]);
        let last = d.timeline.last().unwrap();
        assert_eq!(
            (last.at, last.from, last.to),
            (t1, Some(State::Registered), State::Finalized)
        );
        assert_eq!(last.cause, "finalized: completed");
        assert_eq!(d.finalize_errors, None);

        let err = store.session_detail(SessionId(31_337)).await.unwrap_err();
        assert!(matches!(err, StoreError::UnknownSession(_)), "{err:?}");
        // Past the database's integers no session can be: unknown too, not
        // a failure of the store (a client's guess at an id).
        let past = SessionId(1 << 63);
        let err = store.session_detail(past).await.unwrap_err();
        assert!(
            matches!(err, StoreError::UnknownSession(id) if id == past),
            "{err:?}"
        );
    });
}

/// `settle sessions`: newest first, by state, since a time, up to a limit;
/// and the most recent session for `chat --last`.
pub(crate) fn sessions_list_newest_first_with_filters(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        assert_eq!(store.last_session(None).await.unwrap(), None);
        let o = owner(&*store, HOUR).await;
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut ids = Vec::new();
        for i in 0..5u64 {
            let at = t0 + Duration::from_secs(60 * i);
            ids.push(
                write::register(&*store, NewSession::new(format!("s{i}"), o).at(at))
                    .await
                    .unwrap(),
            );
        }
        for &id in &ids[1..3] {
            assert!(
                write::finalize(&*store, id, FinalizeRequest::new(EndReason::Completed))
                    .await
                    .unwrap()
                    .won()
            );
        }
        let listed = |filter: SessionFilter| {
            let store = store.clone();
            async move {
                store
                    .list_sessions(filter)
                    .await
                    .unwrap()
                    .into_iter()
                    .map(|r| r.id)
                    .collect::<Vec<_>>()
            }
        };
        let newest_first: Vec<SessionId> = ids.iter().rev().copied().collect();
        assert_eq!(listed(SessionFilter::all()).await, newest_first);
        assert_eq!(listed(SessionFilter::all().oldest_first()).await, ids);
        assert_eq!(
            listed(SessionFilter::all().limit(2)).await,
            newest_first[..2]
        );
        assert_eq!(
            listed(SessionFilter::all().limit(2).oldest_first()).await,
            ids[..2]
        );
        assert_eq!(
            listed(SessionFilter::all().in_state(State::Finalized)).await,
            vec![ids[2], ids[1]]
        );
        // Since is inclusive: the session registered at that very time is in.
        let since = t0 + Duration::from_secs(120);
        assert_eq!(
            listed(SessionFilter::all().since(since)).await,
            vec![ids[4], ids[3], ids[2]]
        );
        assert_eq!(
            listed(
                SessionFilter::all()
                    .since(since)
                    .in_state(State::Registered)
                    .limit(1)
            )
            .await,
            vec![ids[4]]
        );
        assert_eq!(listed(SessionFilter::all().limit(0)).await, vec![]);

        assert_eq!(store.last_session(None).await.unwrap(), Some(ids[4]));
        assert_eq!(
            store.last_session(Some(State::Finalized)).await.unwrap(),
            Some(ids[2])
        );
        assert_eq!(
            store.last_session(Some(State::Settled)).await.unwrap(),
            None
        );
    });
}

pub(crate) fn sessions_list_pages_after_a_cursor_among_given_ids(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let o = owner(&*store, HOUR).await;
        let t0 = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut ids = Vec::new();
        // Pairs registered at the same millisecond: the id breaks the tie.
        for i in 0..8u64 {
            let at = t0 + Duration::from_secs(i / 2);
            ids.push(
                write::register(&*store, NewSession::new(format!("s{i}"), o).at(at))
                    .await
                    .unwrap(),
            );
        }
        let page = |filter: SessionFilter| {
            let store = store.clone();
            async move { store.list_sessions(filter).await.unwrap() }
        };
        // Oldest first, three at a time, every session once.
        let mut seen = Vec::new();
        let mut filter = SessionFilter::all().oldest_first().limit(3);
        loop {
            let rows = page(filter.clone()).await;
            seen.extend(rows.iter().map(|r| r.id));
            match rows.last() {
                Some(last) if rows.len() == 3 => filter = filter.after(ListCursor::of(last)),
                _ => break,
            }
        }
        assert_eq!(seen, ids);
        // Newest first after the fourth newest.
        let fourth = page(SessionFilter::all().limit(4)).await.pop().unwrap();
        let rest: Vec<SessionId> = page(SessionFilter::all().after(ListCursor::of(&fourth)))
            .await
            .iter()
            .map(|r| r.id)
            .collect();
        let expected: Vec<SessionId> = ids[..4].iter().rev().copied().collect();
        assert_eq!(rest, expected);
        // Among given ids only, in the same query: a page is full when
        // enough of them pass.
        let mine = vec![ids[1], ids[4], ids[6], ids[7]];
        let first = page(
            SessionFilter::all()
                .oldest_first()
                .only(mine.clone())
                .limit(2),
        )
        .await;
        assert_eq!(first.iter().map(|r| r.id).collect::<Vec<_>>(), mine[..2]);
        let second = page(
            SessionFilter::all()
                .oldest_first()
                .only(mine.clone())
                .limit(2)
                .after(ListCursor::of(&first[1])),
        )
        .await;
        assert_eq!(second.iter().map(|r| r.id).collect::<Vec<_>>(), mine[2..]);
        assert!(page(SessionFilter::all().only(Vec::new())).await.is_empty());
    });
}
