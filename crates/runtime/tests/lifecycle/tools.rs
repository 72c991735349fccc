//! What a framework does around the lifecycle, through the runtime: a
//! tool-call loop whose calls the library puts together, a provider that
//! learns which session and turn it opens for, per-turn timeouts, one idle
//! default, and retries before the first chunk recorded on the turn.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream;
use serde_json::json;
use settle_runtime::{
    Config, Kernel, LifecycleEvent, Message, ModelOptions, Outcome, RetryPolicy, Role, ToolCall,
    TurnOptions, TurnRequest, WorkId,
};
use settle_store::MemoryStore;
use settle_stream::{
    Chunk, ChunkKind, DropClose, Provider, ProviderStream, Request, StreamError, StreamErrorKind,
    StreamEvent, DEFAULT_IDLE_TIMEOUT,
};

use crate::common::*;

const S: Duration = Duration::from_secs(1);

/// A model that asks for the `weather` tool, in three streamed pieces, and
/// answers once the tool's result is in the conversation. Keeps what it was
/// sent.
#[derive(Default)]
struct ToolModel {
    seen: Mutex<Vec<Request>>,
}

#[async_trait]
impl Provider for ToolModel {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        self.seen.lock().unwrap().push(request.clone());
        let answered = request
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Tool);
        let chunks = if answered {
            let result = &request.messages.last().unwrap().content;
            vec![Chunk::text(format!("It is {result} in Paris."))]
        } else {
            vec![
                Chunk::text("Let me check."),
                Chunk::json(
                    ChunkKind::ToolCall,
                    &json!({"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "weather", "arguments": ""}}),
                ),
                Chunk::json(
                    ChunkKind::ToolCall,
                    &json!({"index": 0, "function": {"arguments": "{\"city\":"}}),
                ),
                Chunk::json(
                    ChunkKind::ToolCall,
                    &json!({"index": 0, "function": {"arguments": "\"Paris\"}"}}),
                ),
                Chunk::json(ChunkKind::Usage, &json!({"total_tokens": 12})),
            ]
        };
        let events = chunks.into_iter().map(|c| Ok(StreamEvent::Chunk(c)));
        Ok(Box::new(DropClose::new(stream::iter(events))))
    }
}

#[tokio::test(start_paused = true)]
async fn a_tool_call_loop_runs_model_tool_model_with_the_calls_put_together() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let model = Arc::new(ToolModel::default());
    let tools = json!([{"type": "function", "function": {"name": "weather"}}]);
    let options = ModelOptions::default().tools(tools.clone());
    let mut history = vec![Message::new(Role::User, "Weather in Paris?")];

    let first = agent
        .run_turn(
            model.clone(),
            TurnRequest::new(history.clone()).options(options.clone()),
        )
        .await
        .unwrap()
        .reply()
        .await;
    assert_eq!(first.outcome, Outcome::Completed);
    assert_eq!(first.reply.text, "Let me check.");
    assert_eq!(
        first.reply.tool_calls,
        [ToolCall::new("call_1", "weather", r#"{"city":"Paris"}"#)]
    );
    assert_eq!(first.reply.total_tokens(), 12);

    // Each call runs under the session's lifecycle, then goes back.
    history.push(first.reply.to_message());
    for call in &first.reply.tool_calls {
        let city = call.parse_arguments().unwrap()["city"]
            .as_str()
            .unwrap()
            .to_owned();
        let tool = agent
            .spawn(move |_ctx| async move { format!("sunny ({city})") })
            .await
            .unwrap();
        history.push(Message::tool_result(&call.id, tool.join().await.unwrap()));
    }
    let second = agent
        .run_turn(model.clone(), TurnRequest::new(history).options(options))
        .await
        .unwrap()
        .reply()
        .await;
    assert_eq!(second.reply.text, "It is sunny (Paris) in Paris.");
    assert!(second.reply.tool_calls.is_empty());

    let seen = model.seen.lock().unwrap().clone();
    // The provider learnt which session and turn each request is for.
    let turns: Vec<_> = seen.iter().map(|r| r.turn).collect();
    assert_eq!(
        turns,
        [
            Some(WorkId::turn(agent.id(), 1)),
            Some(WorkId::turn(agent.id(), 2))
        ]
    );
    assert_eq!(seen[1].options.tools.as_ref(), Some(&tools));
    let sent = serde_json::to_value(&seen[1].messages).unwrap();
    assert_eq!(sent[1]["tool_calls"][0]["id"], "call_1");
    assert_eq!(
        sent[1]["tool_calls"][0]["function"]["arguments"],
        r#"{"city":"Paris"}"#
    );
    assert_eq!(sent[2]["tool_call_id"], "call_1");
    assert_eq!(
        agent.finish().await.unwrap(),
        settle_runtime::EndReason::Completed
    );
}

#[tokio::test(start_paused = true)]
async fn a_streamed_turn_exposes_its_tool_calls_once_read() {
    use futures_util::StreamExt;
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let mut turn = agent
        .run_turn(Arc::new(ToolModel::default()), TurnRequest::prompt("hi"))
        .await
        .unwrap();
    let mut kinds = Vec::new();
    while let Some(chunk) = turn.next().await {
        kinds.push(chunk.kind());
    }
    assert_eq!(kinds.len(), 5);
    assert_eq!(turn.tool_calls()[0].arguments, r#"{"city":"Paris"}"#);
    assert_eq!(turn.outcome().await, Outcome::Completed);
}

#[tokio::test(start_paused = true)]
async fn a_turns_own_idle_timeout_overrides_the_kernels() {
    let store = MemoryStore::new();
    // The kernel has no idle timeout at all.
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let hung = provider([hang(&["a"], Duration::ZERO)]);
    let began = tokio::time::Instant::now();
    let turn = agent
        .run_turn_with(
            hung.clone(),
            TurnRequest::prompt("go"),
            TurnOptions::default().idle_timeout(5 * S),
        )
        .await
        .unwrap();
    let (outcome, error) = turn.end().await;
    assert_eq!(outcome, Outcome::IdleTimeout);
    assert!(error.unwrap().message.contains("5s"));
    let waited = began.elapsed();
    assert!(waited >= 5 * S && waited < 6 * S, "{waited:?}");
    assert_eq!(hung.stats().close_finished, 1);
}

#[test]
fn the_idle_timeout_has_one_default_everywhere() {
    assert_eq!(Config::default().idle_timeout, Some(DEFAULT_IDLE_TIMEOUT));
    assert_eq!(
        Config::default().turn_options().idle_timeout,
        TurnOptions::default().idle_timeout
    );
}

/// Answers 503 to its first opens, then plays `then`.
struct Unavailable {
    left: Mutex<VecDeque<u16>>,
    then: Arc<settle_stream::ScriptedProvider>,
}

#[async_trait]
impl Provider for Unavailable {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        if let Some(status) = self.left.lock().unwrap().pop_front() {
            return Err(StreamErrorKind::Status {
                url: "http://model/v1/chat/completions".into(),
                status,
                body: "overloaded".into(),
                retry_after: None,
            }
            .into());
        }
        self.then.open(request).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_before_the_first_chunk_is_recorded_on_the_turn() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| {
        b.retry(RetryPolicy::default().retries(2).backoff(S, 4 * S))
    })
    .await;
    let agent = kernel.register("agent", None).await.unwrap();
    let mut events = agent.subscribe();
    let model = Arc::new(Unavailable {
        left: Mutex::new([503, 429].into()),
        then: provider([complete(&["finally"], Duration::ZERO)]),
    });
    let done = agent
        .run_turn(model, TurnRequest::prompt("go"))
        .await
        .unwrap()
        .reply()
        .await;
    assert_eq!(done.outcome, Outcome::Completed);
    assert_eq!(done.reply.text, "finally");
    assert_eq!(done.retries, 2, "the turn says how often it was retried");
    let retries: Vec<_> = drain(&mut events)
        .into_iter()
        .filter_map(|e| match e {
            LifecycleEvent::TurnRetried {
                work,
                attempt,
                delay,
                error,
                ..
            } => Some((work, attempt, delay, error.message)),
            _ => None,
        })
        .collect();
    let work = WorkId::turn(agent.id(), 1);
    assert_eq!(retries.len(), 2, "{retries:?}");
    assert_eq!((retries[0].0, retries[0].1, retries[0].2), (work, 1, S));
    assert_eq!((retries[1].0, retries[1].1, retries[1].2), (work, 2, 2 * S));
    assert!(retries[0].3.contains("HTTP 503"), "{}", retries[0].3);
    // The stored turn has the one reply, nothing of the failed openings.
    let detail = detail(&store, agent.id()).await;
    assert_eq!(detail.turns.len(), 1);
    assert_eq!(detail.turns[0].text(), "finally");
}

#[tokio::test(start_paused = true)]
async fn resume_replays_the_pending_tool_calls_of_the_last_reply() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let model = Arc::new(ToolModel::default());
    let first = agent
        .run_turn(model.clone(), TurnRequest::prompt("Weather in Paris?"))
        .await
        .unwrap()
        .reply()
        .await;
    assert_eq!(first.reply.tool_calls.len(), 1);
    // The agent stops before running the tool (a crash, a deploy).
    agent.finish().await.unwrap();

    let resumed = kernel.resume(agent.id(), "agent again").await.unwrap();
    goes_on_from_the_weather_call(
        &resumed.session,
        &resumed.history,
        &resumed.pending_tool_calls,
        model,
    )
    .await;
}

/// A model whose tool call is cut after its first piece: its stream goes
/// quiet there until the turn is ended.
struct CutModel;

#[async_trait]
impl Provider for CutModel {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        let piece = Chunk::json(
            ChunkKind::ToolCall,
            &json!({"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "weather", "arguments": "{\"city\":"}}),
        );
        let events = futures_util::StreamExt::chain(
            stream::iter([Ok(StreamEvent::Chunk(piece))]),
            stream::pending(),
        );
        Ok(Box::new(DropClose::new(events)))
    }
}

/// G7 and tools: a reply cut before its end (cancelled, interrupted by a
/// crash) leaves no tool call pending: its arguments may stop mid-JSON, and
/// running it would run what the model never asked for.
#[tokio::test(start_paused = true)]
async fn resume_leaves_the_tool_calls_of_a_cut_reply_unrun() {
    use futures_util::StreamExt;
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel.register("agent", None).await.unwrap();
    let mut turn = agent
        .run_turn(Arc::new(CutModel), TurnRequest::prompt("Weather in Paris?"))
        .await
        .unwrap();
    assert_eq!(
        turn.next().await.map(|c| c.kind()),
        Some(ChunkKind::ToolCall)
    );
    assert_eq!(turn.tool_calls()[0].arguments, "{\"city\":");
    turn.cancel();
    assert_eq!(turn.outcome().await, Outcome::Cancelled);
    agent.finish().await.unwrap();

    let resumed = kernel.resume(agent.id(), "agent again").await.unwrap();
    assert!(resumed.pending_tool_calls.is_empty());
    assert!(resumed.history.iter().all(|m| m.tool_calls.is_none()));
    assert_eq!(resumed.history[0].content, "Weather in Paris?");
}

/// G12 and tools: a session handed off between its model's tool calls and
/// their results is adopted with those calls as the conversation's next
/// step, as a resumed one is: the history ends with the reply that made
/// them, and the adoption says which are pending.
#[tokio::test]
async fn g12_an_adopted_session_goes_on_from_its_last_replys_pending_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fleet.db");
    let store: Arc<dyn settle_store::SessionStore> =
        Arc::new(settle_store::Store::open(path.to_str().unwrap()).unwrap());
    let node = |url: &str| {
        Kernel::builder(store.clone())
            .idle_timeout(None)
            .advertise(Some(url.to_owned()))
            .start()
    };
    let a = node("ws://a/ws").await.unwrap();
    let b = node("ws://b/ws").await.unwrap();
    let agent = a.register("agent", None).await.unwrap();
    let model = Arc::new(ToolModel::default());
    let first = agent
        .run_turn(model.clone(), TurnRequest::prompt("Weather in Paris?"))
        .await
        .unwrap()
        .reply()
        .await;
    assert_eq!(first.reply.tool_calls.len(), 1);
    // A redeploy before the tool ran.
    assert!(a.handoff(Duration::from_secs(5)).await.handoff);

    let adoption = b.adopt(agent.id()).await.unwrap();
    goes_on_from_the_weather_call(
        &adoption.session,
        &adoption.history,
        &adoption.pending_tool_calls,
        model,
    )
    .await;
    b.shutdown(Duration::ZERO).await;
}

/// The conversation `history` of a session taken on again (resumed or
/// adopted) ends with the model's pending weather call, and goes on from it:
/// the tool's result sent with the next turn gets the model's answer.
async fn goes_on_from_the_weather_call(
    session: &settle_runtime::SessionHandle,
    history: &[Message],
    pending: &[ToolCall],
    model: Arc<ToolModel>,
) {
    let call = ToolCall::new("call_1", "weather", r#"{"city":"Paris"}"#);
    assert_eq!(pending, std::slice::from_ref(&call));
    assert_eq!(
        serde_json::to_value(history).unwrap(),
        json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [call.to_json()]},
        ])
    );
    let mut next = history.to_vec();
    next.push(Message::tool_result(&call.id, "rainy"));
    let done = session
        .run_turn(model, TurnRequest::new(next))
        .await
        .unwrap()
        .reply()
        .await;
    assert_eq!(done.reply.text, "It is rainy in Paris.");
}
