//! With the `otel-genai` feature, the lifecycle's spans follow
//! OpenTelemetry's GenAI semantic conventions. Exported through
//! `tracing-opentelemetry` to the SDK's in-memory exporter: a turn is an
//! `invoke_agent {agent}` client span with `gen_ai.operation.name`,
//! `gen_ai.agent.name`, `gen_ai.conversation.id` (the session),
//! `gen_ai.provider.name`, `gen_ai.usage.*` and, when it failed,
//! `error.type`; a child session's spans nest under its parent's.
//! (`cargo test -p settle-runtime --features otel-genai --test genai_spans`)
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream;
use opentelemetry::trace::{SpanId, Status, TracerProvider as _};
use opentelemetry::Value;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider, SpanData};
use serde_json::json;
use settle_runtime::{EndReason, Kernel, Outcome, TurnRequest};
use settle_store::MemoryStore;
use settle_stream::{
    Chunk, ChunkKind, DropClose, Provider, ProviderStream, Request, ScriptedEnd, ScriptedProvider,
    StreamError, StreamEvent, TurnScript,
};
use tracing_subscriber::layer::SubscriberExt;

/// A model that answers and reports its usage.
struct Model;

#[async_trait]
impl Provider for Model {
    async fn open(&self, _: &Request) -> Result<ProviderStream, StreamError> {
        let usage = json!({"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12});
        let events = stream::iter([
            Ok(StreamEvent::Chunk(Chunk::text("22/tcp open"))),
            Ok(StreamEvent::Chunk(Chunk::json(ChunkKind::Usage, &usage))),
        ]);
        Ok(Box::new(DropClose::new(events)))
    }

    fn name(&self) -> &str {
        "openai"
    }
}

fn attribute<'a>(span: &'a SpanData, key: &str) -> Option<&'a Value> {
    span.attributes
        .iter()
        .find(|kv| kv.key.as_str() == key)
        .map(|kv| &kv.value)
}

fn text(span: &SpanData, key: &str) -> Option<String> {
    attribute(span, key).map(Value::to_string)
}

#[tokio::test(flavor = "current_thread")]
async fn turns_are_invoke_agent_spans_nested_under_their_parents() {
    let exporter = InMemorySpanExporter::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("settle-test")));
    let _default = tracing::subscriber::set_default(subscriber);

    let kernel = Kernel::builder(Arc::new(MemoryStore::new()))
        .idle_timeout(None)
        .start()
        .await
        .unwrap();
    let root = kernel.register("coordinator", None).await.unwrap();
    let child = root.child("scanner").await.unwrap();
    let (root_id, child_id) = (root.id(), child.id());
    let turn = child
        .run_turn(Arc::new(Model), TurnRequest::prompt("scan"))
        .await
        .unwrap();
    assert_eq!(turn.reply().await.outcome, Outcome::Completed);
    let failing = Arc::new(ScriptedProvider::new([
        TurnScript::new(["planning"]).end(ScriptedEnd::Fail)
    ]));
    let failed = root
        .run_turn(failing, TurnRequest::prompt("plan"))
        .await
        .unwrap();
    assert_eq!(failed.outcome().await, Outcome::Failed);
    assert_eq!(root.finish().await.unwrap(), EndReason::Failed);
    drop((root, child));
    kernel.shutdown(Duration::from_secs(1)).await;
    drop(kernel);
    tokio::time::sleep(Duration::from_millis(50)).await;
    provider.force_flush().unwrap();

    let spans = exporter.get_finished_spans().unwrap();
    let named = |name: &str| {
        spans.iter().find(|s| s.name == name).unwrap_or_else(|| {
            let names: Vec<_> = spans.iter().map(|s| s.name.to_string()).collect();
            panic!("no span {name} in {names:?}")
        })
    };
    let scan = named("invoke_agent scanner");
    assert_eq!(scan.span_kind, opentelemetry::trace::SpanKind::Client);
    assert_eq!(
        text(scan, "gen_ai.operation.name").as_deref(),
        Some("invoke_agent")
    );
    assert_eq!(text(scan, "gen_ai.agent.name").as_deref(), Some("scanner"));
    assert_eq!(
        text(scan, "gen_ai.conversation.id"),
        Some(child_id.0.to_string())
    );
    assert_eq!(
        text(scan, "gen_ai.provider.name").as_deref(),
        Some("openai")
    );
    assert_eq!(
        attribute(scan, "gen_ai.usage.input_tokens"),
        Some(&Value::I64(9))
    );
    assert_eq!(
        attribute(scan, "gen_ai.usage.output_tokens"),
        Some(&Value::I64(3))
    );
    assert_eq!(attribute(scan, "error.type"), None);

    let plan = named("invoke_agent coordinator");
    assert_eq!(text(plan, "error.type").as_deref(), Some("provider"));
    assert!(
        matches!(plan.status, Status::Error { .. }),
        "{:?}",
        plan.status
    );

    // The nesting: turn → its session → the parent's session.
    let sessions: Vec<&SpanData> = spans.iter().filter(|s| s.name == "session").collect();
    let session_of = |id: u64| {
        *sessions
            .iter()
            .find(|s| text(s, "gen_ai.conversation.id") == Some(id.to_string()))
            .unwrap()
    };
    let (root_span, child_span) = (session_of(root_id.0), session_of(child_id.0));
    assert_eq!(scan.parent_span_id, child_span.span_context.span_id());
    assert_eq!(child_span.parent_span_id, root_span.span_context.span_id());
    assert_eq!(root_span.parent_span_id, SpanId::INVALID);
    assert_eq!(plan.parent_span_id, root_span.span_context.span_id());
    assert_eq!(
        scan.span_context.trace_id(),
        root_span.span_context.trace_id(),
        "one trace for the agent tree"
    );
}
