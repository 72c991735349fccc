//! A chat sends its whole history with every turn; the store keeps what
//! each turn adds, so a session's storage grows with its length, not its
//! square. What each turn was sent reads back whole (show, export, resume),
//! and a turn over the size limits is refused before anything is written.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use serde_json::{json, Value};
use settle_runtime::{Kernel, Outcome, RuntimeError, TurnRequest};
use settle_store::{Conversation, MemoryStore, SessionDetail, SessionStore, Store};
use settle_stream::{
    Message, Provider, ProviderStream, Request, Role, ScriptedProvider, StreamError, TurnScript,
};

use crate::common::*;

const MS: Duration = Duration::from_millis(1);

/// Plays its script and keeps every request it is sent.
struct Recording {
    script: ScriptedProvider,
    seen: Mutex<Vec<Vec<Message>>>,
}

impl Recording {
    fn new(turns: impl IntoIterator<Item = TurnScript>) -> Arc<Self> {
        Arc::new(Recording {
            script: ScriptedProvider::new(turns),
            seen: Mutex::default(),
        })
    }

    fn seen(&self) -> Vec<Vec<Value>> {
        let seen = self.seen.lock().unwrap();
        seen.iter()
            .map(|m| m.iter().map(|m| serde_json::to_value(m).unwrap()).collect())
            .collect()
    }
}

#[async_trait]
impl Provider for Recording {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        self.seen.lock().unwrap().push(request.messages.clone());
        self.script.open(request).await
    }
}

/// What each turn of `detail` was sent, rebuilt from the store.
fn rebuilt(detail: &SessionDetail) -> Vec<Vec<Value>> {
    let mut conversation = Conversation::new();
    detail
        .turns
        .iter()
        .map(|t| {
            conversation
                .turn(t)
                .map(<[Value]>::to_vec)
                .unwrap_or_default()
        })
        .collect()
}

/// The bytes of the input a turn's row holds.
fn stored_bytes(detail: &SessionDetail, no: usize) -> usize {
    detail.turns[no]
        .input
        .as_ref()
        .map_or(0, |i| i.messages.to_string().len())
}

/// 20 turns of a 500 KiB prompt, each sent with the whole history, on a
/// SQLite file: the 20th turn's row holds about one prompt, not 20, and the
/// whole conversation reads back as it was sent, and resumes whole.
// On the real clock: a real store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_turns_of_a_large_prompt_store_each_prompt_once() {
    const TURNS: usize = 20;
    const PROMPT: usize = 500 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("settle.db");
    let store = Store::open(path.to_str().unwrap()).unwrap();
    let kernel = Kernel::builder(Arc::new(store.clone()))
        .idle_timeout(None)
        .start()
        .await
        .unwrap();
    let chat = kernel.register("chat", None).await.unwrap();
    let provider = Recording::new((0..TURNS).map(|n| TurnScript::new([format!("reply {n}")])));
    let mut history = vec![Message::new(Role::System, "be brief")];
    for n in 0..TURNS {
        let prompt = format!("{n:02}{}", "x".repeat(PROMPT - 2));
        history.push(Message::new(Role::User, prompt));
        let turn = chat
            .run_turn(provider.clone(), TurnRequest::new(history.clone()))
            .await
            .unwrap();
        assert_eq!(turn.outcome().await, Outcome::Completed);
        history.push(Message::new(Role::Assistant, format!("reply {n}")));
    }
    let detail = store.session_detail(chat.id()).await.unwrap();
    let last = stored_bytes(&detail, TURNS - 1);
    let total: usize = (0..TURNS).map(|n| stored_bytes(&detail, n)).sum();
    let bytes = |name: &str| std::fs::metadata(dir.path().join(name)).map_or(0, |m| m.len());
    eprintln!(
        "{TURNS} turns of {PROMPT} bytes: {total} bytes of input stored, turn {TURNS} {last}; \
         database {} bytes, WAL {} bytes",
        bytes("settle.db"),
        bytes("settle.db-wal")
    );
    assert!(
        (PROMPT..PROMPT + 1024).contains(&last),
        "turn {TURNS} stores {last} bytes of input for a {PROMPT}-byte prompt"
    );
    assert!(
        total < (TURNS + 1) * PROMPT,
        "{total} bytes of input stored"
    );
    assert_eq!(rebuilt(&detail), provider.seen());

    assert_eq!(
        chat.close().await.unwrap(),
        settle_runtime::EndReason::UserClose
    );
    let resumed = kernel.resume(chat.id(), "again").await.unwrap();
    assert_eq!(resumed.history, history);
    kernel.shutdown(Duration::ZERO).await;
}

/// Whatever the caller keeps of each reply (all of it, its own version of
/// it, nothing), and whatever it adds (tool results, a fresh prompt), each
/// turn reads back as exactly what it was sent.
#[tokio::test(start_paused = true)]
async fn each_turn_reads_back_as_what_it_was_sent() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let chat = kernel.register("agent", None).await.unwrap();
    let provider = Recording::new([
        complete(&["calling ", "a tool"], MS),
        complete(&["22 is open"], MS),
        TurnScript::new(["half"]).end(settle_stream::ScriptedEnd::Fail),
        complete(&["80 is closed"], MS),
        complete(&["fresh"], MS),
        complete(&["again"], MS),
    ]);
    let send = |messages: Vec<Message>| {
        let (chat, provider) = (chat.clone(), provider.clone());
        async move {
            let turn = chat
                .run_turn(provider, TurnRequest::new(messages))
                .await
                .unwrap();
            let _ = turn.outcome().await;
        }
    };
    let calls = json!([{"id": "c1", "type": "function",
                        "function": {"name": "scan", "arguments": "{}"}}]);
    let mut history = vec![
        Message::new(Role::System, "scan"),
        Message::new(Role::User, "is 22 open?"),
    ];
    send(history.clone()).await;
    // The reply kept in the caller's own words (with its tool call), and
    // the tool's result.
    history.push(Message::new(Role::Assistant, "calling a tool").tool_calls(calls));
    history.push(Message::tool_result("c1", "open"));
    send(history.clone()).await;
    // The reply kept as it came, then a prompt.
    history.push(Message::new(Role::Assistant, "22 is open"));
    history.push(Message::new(Role::User, "and 80?"));
    send(history.clone()).await;
    // The failed reply dropped, a prompt added.
    history.push(Message::new(Role::User, "and 80, again?"));
    send(history.clone()).await;
    // A fresh prompt that does not continue the conversation, then one
    // that continues it.
    let mut fresh = vec![Message::new(Role::User, "something else")];
    send(fresh.clone()).await;
    fresh.push(Message::new(Role::Assistant, "fresh"));
    fresh.push(Message::new(Role::User, "more"));
    send(fresh).await;

    let detail = detail(&store, chat.id()).await;
    assert_eq!(rebuilt(&detail), provider.seen());
    let stored: Vec<_> = detail
        .turns
        .iter()
        .map(|t| t.input.as_ref().map(|i| i.continues))
        .collect();
    // Whole; after the 2 sent (the caller's own reply follows); after the 4
    // sent and the reply; after the 6 sent (the failed reply dropped);
    // whole (a fresh prompt); after the 1 sent and the reply.
    assert_eq!(
        stored,
        [
            Some(None),
            Some(Some(2)),
            Some(Some(5)),
            Some(Some(6)),
            Some(None),
            Some(Some(2))
        ]
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// A message over `max_prompt_bytes`, or a request over
/// `max_history_bytes`, is refused before anything is written: no turn, no
/// transition; the session takes the next turn that fits.
#[tokio::test(start_paused = true)]
async fn g11_a_turn_over_the_size_limits_is_refused_and_writes_nothing() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| {
        b.max_prompt_bytes(Some(1000)).max_history_bytes(Some(3000))
    })
    .await;
    let chat = kernel.register("chat", None).await.unwrap();
    let before = detail(&store, chat.id()).await;
    let p = provider([complete(&["ok"], MS)]);

    let big = TurnRequest::prompt("x".repeat(1001));
    let refused = chat.run_turn(p.clone(), big).await.map(|_| ());
    assert!(
        matches!(refused, Err(RuntimeError::TooLarge { limit: 1000, .. })),
        "{refused:?}"
    );
    let long = TurnRequest::new(vec![Message::new(Role::User, "y".repeat(900)); 4]);
    let refused = chat.run_turn(p.clone(), long).await.map(|_| ());
    let Err(error) = refused else {
        panic!("a 3600-byte history under a 3000-byte limit was accepted")
    };
    assert!(matches!(error, RuntimeError::TooLarge { limit: 3000, .. }));
    assert!(error.to_string().contains("max_history_bytes"), "{error}");
    settle_tasks().await;
    let after = detail(&store, chat.id()).await;
    assert_eq!(after.turns, before.turns);
    assert_eq!(after.timeline, before.timeline);

    let turn = chat
        .run_turn(p, TurnRequest::prompt("x".repeat(1000)))
        .await
        .unwrap();
    assert_eq!(turn.outcome().await, Outcome::Completed);
    kernel.shutdown(Duration::ZERO).await;
}

/// Found from outside: `settle chat --resume 1` left at once (stdin
/// closed) made a session that ran no turn, and the next `chat --last`
/// resumed that one with no history: one Ctrl-D lost the conversation. A
/// session that ran nothing continues the one it resumed, as far back as
/// sessions ran nothing.
#[tokio::test(start_paused = true)]
async fn resuming_a_session_that_ran_no_turn_continues_the_one_it_resumed() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let chat = kernel.register("chat", None).await.unwrap();
    let provider = Arc::new(ScriptedProvider::new([TurnScript::new(["hello back"])]));
    let asked = vec![Message::new(Role::User, "hello")];
    let turn = chat
        .run_turn(provider, TurnRequest::new(asked.clone()))
        .await
        .unwrap();
    assert_eq!(turn.outcome().await, Outcome::Completed);
    chat.close().await.unwrap();
    let mut from = chat.id();
    // Resumed and left twice without a turn.
    for _ in 0..2 {
        let empty = kernel.resume(from, "again").await.unwrap();
        assert_eq!(empty.history.len(), 2, "{:?}", empty.history);
        empty.session.close().await.unwrap();
        from = empty.session.id();
    }
    let resumed = kernel.resume(from, "at last").await.unwrap();
    let expected = [
        Message::new(Role::User, "hello"),
        Message::new(Role::Assistant, "hello back"),
    ];
    assert_eq!(resumed.history, expected);
    kernel.shutdown(Duration::ZERO).await;
}
