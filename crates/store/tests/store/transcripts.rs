//! Whole transcripts: each turn's input, its chunks of every kind, its error;
//! resumed sessions.

use serde_json::json;
use settle_store::{
    ChunkKind, EndReason, FinalizeRequest, Finalized, NewChunk, NewSession, Outcome, SessionId,
    StoreError, TurnError, TurnErrorKind, TurnInput,
};

use crate::common::{rt, Backend, TestDb};
use crate::{now, open, session, write};

/// A turn keeps what it was sent, its text and structured chunks in order,
/// and why it failed; the reply reads as one text, and memory takes only the
/// reply text of completed turns (G7).
pub(crate) fn g7_whole_transcripts_keep_input_chunks_and_errors(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "chat").await;
        let input = json!([
            {"role": "system", "content": "You scan ports."},
            {"role": "user", "content": "Is 22 open? \u{1F50D} \"quoted\""},
        ]);
        write::start_turn(&*store, id, 1, Some(input.clone()), now())
            .await
            .unwrap();
        let call = json!({"name": "scan", "arguments": {"port": 22}});
        let usage = json!({"prompt_tokens": 12, "completion_tokens": 3});
        let chunks = [
            NewChunk::text("Port 22 "),
            NewChunk::structured(ChunkKind::ToolCall, call.clone()),
            NewChunk::structured(ChunkKind::Reasoning, json!("ssh is usual"))
                .with_text("thinking…"),
            NewChunk::text("is open."),
            NewChunk::structured(ChunkKind::Usage, usage.clone()),
        ];
        for chunk in chunks.clone() {
            store.append_chunk(id, 1, chunk).await.unwrap();
        }
        write::end_turn(&*store, id, 1, Outcome::Completed, None, now())
            .await
            .unwrap();

        write::start_turn(&*store, id, 2, None, now()).await.unwrap();
        store.append_chunk(id, 2, "half".into()).await.unwrap();
        let error = TurnError::new(
            TurnErrorKind::HttpStatus,
            "HTTP 500 Internal Server Error from http://127.0.0.1:9/v1/chat/completions: {\"error\":\"boom\"}",
        );
        write::end_turn(&*store, id, 2, Outcome::Failed, Some(error.clone()), now())
            .await
            .unwrap();

        let detail = store.session_detail(id).await.unwrap();
        let [one, two] = &detail.turns[..] else {
            panic!("two turns: {:?}", detail.turns)
        };
        assert_eq!(one.input, Some(TurnInput::whole(input)));
        assert_eq!(one.error, None);
        assert_eq!(one.text(), "Port 22 is open.");
        let kinds: Vec<_> = one.chunks.iter().map(|c| (c.seq, c.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (0, ChunkKind::Text),
                (1, ChunkKind::ToolCall),
                (2, ChunkKind::Reasoning),
                (3, ChunkKind::Text),
                (4, ChunkKind::Usage),
            ]
        );
        for (row, sent) in one.chunks.iter().zip(&chunks) {
            assert_eq!((&row.text, &row.data), (&sent.text, &sent.data));
        }
        assert_eq!(two.input, None);
        assert_eq!(two.outcome, Some(Outcome::Failed));
        assert_eq!(two.error, Some(error));
        assert_eq!(two.text(), "half");
        assert_eq!(detail.session.chunks, 6);

        let plan = FinalizeRequest::new(EndReason::Completed).commit_memory(true);
        let Finalized::Won(report) = write::finalize(&*store, id, plan).await.unwrap() else {
            panic!("must win")
        };
        assert_eq!(report.memories, 1);
        let memories = store.memories(id).await.unwrap();
        assert_eq!(
            (memories[0].turn, memories[0].content.as_str()),
            (1, "Port 22 is open.")
        );
    });
}

/// A completed turn of structured chunks only has no reply text: it commits
/// no memory row.
pub(crate) fn g7_a_turn_without_reply_text_commits_no_memory(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "tools").await;
        write::start_turn(&*store, id, 1, None, now())
            .await
            .unwrap();
        let call = NewChunk::structured(ChunkKind::ToolCall, json!({"name": "ls"}));
        store.append_chunk(id, 1, call).await.unwrap();
        write::end_turn(&*store, id, 1, Outcome::Completed, None, now())
            .await
            .unwrap();
        let plan = FinalizeRequest::new(EndReason::Completed).commit_memory(true);
        let Finalized::Won(report) = write::finalize(&*store, id, plan).await.unwrap() else {
            panic!("must win")
        };
        assert_eq!(report.memories, 0);
        assert!(store.memories(id).await.unwrap().is_empty());
    });
}

/// A resumed session names the session it continues; a session that does not
/// exist cannot be resumed.
pub(crate) fn resumed_sessions_name_the_session_they_continue(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (owner, first) = session(&*store, "first").await;
        assert!(
            write::finalize(&*store, first, FinalizeRequest::new(EndReason::UserClose))
                .await
                .unwrap()
                .won()
        );
        let second = write::register(&*store, NewSession::new("again", owner).resuming(first))
            .await
            .unwrap();
        let row = store.session_detail(second).await.unwrap().session;
        assert_eq!(row.resumed_from, Some(first));
        assert_eq!(
            store
                .session_detail(first)
                .await
                .unwrap()
                .session
                .resumed_from,
            None
        );

        let ghost = SessionId(777_001);
        let err = write::register(&*store, NewSession::new("nowhere", owner).resuming(ghost))
            .await
            .unwrap_err();
        assert!(
            matches!(err, StoreError::UnknownSession(s) if s == ghost),
            "{err:?}"
        );
        assert_eq!(store.last_session(None).await.unwrap(), Some(second));
    });
}

/// A page of one turn reads the same as the same page cut from the whole
/// session: any turn (or the last), from any chunk, at most as many chunks
/// as asked, and whether more follow; an unknown session is refused as its
/// detail is.
pub(crate) fn a_page_of_a_turn_is_that_turn_of_the_whole_session_from_a_chunk(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "long").await;
        let (_, empty) = session(&*store, "no turns").await;
        for no in 1..=3u32 {
            write::start_turn(&*store, id, no, None, now())
                .await
                .unwrap();
            for seq in 0..(no * 4) {
                let chunk = match seq % 3 {
                    0 => NewChunk::structured(ChunkKind::ToolCall, json!({ "n": seq })),
                    _ => NewChunk::text(format!("t{no}c{seq}")),
                };
                store.append_chunk(id, no, chunk).await.unwrap();
            }
            write::end_turn(&*store, id, no, Outcome::Completed, None, now())
                .await
                .unwrap();
        }
        let detail = store.session_detail(id).await.unwrap();
        for turn in [None, Some(1), Some(2), Some(3), Some(4)] {
            for from in [0, 1, 5, 11, 12, 40] {
                for most in [0, 1, 3, 100] {
                    let page = store.turn_page(id, turn, from, most).await.unwrap();
                    let cut = settle_store::TurnPage::of(&detail, turn, from, most);
                    assert_eq!(page, cut, "turn {turn:?} from {from}, at most {most}");
                }
            }
        }
        let last = store.turn_page(id, None, 10, 1).await.unwrap();
        let row = last.turn.expect("the last turn");
        assert_eq!(
            (last.turns, row.no, row.chunks.len(), last.more),
            (3, 3, 1, true)
        );
        assert_eq!(row.chunks[0].text, "t3c10");
        let none = store.turn_page(empty, None, 0, 10).await.unwrap();
        assert_eq!((none.turns, none.turn, none.more), (0, None, false));
        let unknown = store.turn_page(SessionId(9_999_999), None, 0, 10).await;
        assert!(
            matches!(unknown, Err(StoreError::UnknownSession(_))),
            "{unknown:?}"
        );
    });
}
