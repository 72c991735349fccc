//! A turn's input stored as the messages it added: the conversation reads
//! back whole through `Conversation`, and rows of the older whole format
//! read as before, alone and mixed with new ones.

use serde_json::{json, Value};
use settle_store::{Conversation, LifecycleWrite, Outcome, SessionDetail, TurnInput};

use crate::common::{rt, Backend, TestDb};
use crate::{now, open, session, write};

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn assistant(text: &str) -> Value {
    json!({"role": "assistant", "content": text})
}

/// What each turn of `detail` was sent, rebuilt.
fn sent(detail: &SessionDetail) -> Vec<Option<Vec<Value>>> {
    let mut conversation = Conversation::new();
    detail
        .turns
        .iter()
        .map(|t| conversation.turn(t).map(<[Value]>::to_vec))
        .collect()
}

/// Each turn stores what it adds; reading rebuilds what it was sent, reply
/// kept or dropped, tool messages and all.
pub(crate) fn turn_inputs_are_additions_and_read_back_whole(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "chat").await;
        let tool = json!({"role": "tool", "content": "22 open", "tool_call_id": "c1"});
        let inputs = [
            TurnInput::whole(json!([{"role": "system", "content": "scan"}, user("a")])),
            // Kept the reply "A" (3 messages), added a tool result.
            TurnInput::added(3, json!([tool.clone()])),
            // The reply failed and was dropped: 4 messages, then a prompt.
            TurnInput::added(4, json!([user("c")])),
        ];
        let replies = ["A", "oops", "C"];
        for (no, (input, reply)) in (1..).zip(inputs.iter().zip(replies)) {
            let start = LifecycleWrite::StartTurn {
                session: id,
                no,
                input: Some(input.clone()),
                at: now(),
            };
            let answers = store.apply(vec![start]).await;
            assert!(matches!(answers.first(), Some(Ok(_))), "{answers:?}");
            store.append_chunk(id, no, reply.into()).await.unwrap();
            write::end_turn(&*store, id, no, Outcome::Completed, None, now())
                .await
                .unwrap();
        }
        let detail = store.session_detail(id).await.unwrap();
        let stored: Vec<_> = detail.turns.iter().map(|t| t.input.clone()).collect();
        assert_eq!(stored, inputs.map(Some));
        let system = json!({"role": "system", "content": "scan"});
        let second = vec![system.clone(), user("a"), assistant("A"), tool.clone()];
        let mut third = second.clone();
        third.push(user("c"));
        assert_eq!(
            sent(&detail),
            vec![Some(vec![system, user("a")]), Some(second), Some(third)]
        );
    });
}

/// A database written when each turn stored its whole conversation reads
/// the same: each old row is everything its turn was sent, and a new row
/// after them continues the conversation the old ones hold.
pub(crate) fn an_old_whole_conversation_row_reads_as_before(b: Backend) {
    let Some(db) = TestDb::new(b) else { return };
    rt().block_on(async {
        let store = open(&db);
        let (_, id) = session(&*store, "old chat").await;
        let one = json!([user("a")]);
        let two = json!([user("a"), assistant("A"), user("b")]);
        // Rows as the old code wrote them: the whole conversation, no
        // `input_from`.
        db.execute(&format!(
            "INSERT INTO turns (session, \"no\", outcome, started_at, ended_at, next_seq, input) \
               VALUES ({s}, 1, 'completed', 1, 2, 1, '{one}'), ({s}, 2, 'completed', 3, 4, 1, '{two}');\
             INSERT INTO chunks (session, turn_no, seq, \"text\") VALUES ({s}, 1, 0, 'A'), ({s}, 2, 0, 'B');",
            s = id.get()
        ));
        let detail = store.session_detail(id).await.unwrap();
        assert_eq!(detail.turns[1].input, Some(TurnInput::whole(two.clone())));
        assert_eq!(
            sent(&detail),
            vec![
                Some(one.as_array().unwrap().clone()),
                Some(two.as_array().unwrap().clone())
            ]
        );
        // A new turn continues the old rows' conversation.
        let start = LifecycleWrite::StartTurn {
            session: id,
            no: 3,
            input: Some(TurnInput::added(4, json!([user("c")]))),
            at: now(),
        };
        let answers = store.apply(vec![start]).await;
        assert!(matches!(answers.first(), Some(Ok(_))), "{answers:?}");
        let detail = store.session_detail(id).await.unwrap();
        let third = sent(&detail).pop().flatten().unwrap();
        assert_eq!(
            third,
            vec![user("a"), assistant("A"), user("b"), assistant("B"), user("c")]
        );
    });
}
