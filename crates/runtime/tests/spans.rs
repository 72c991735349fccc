//! The lifecycle as `tracing` spans: an embedder's layer (OpenTelemetry's,
//! say) sees each turn, task, finalize and end hook inside its
//! `session{id,name,parent}` span, with no code of its own.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use settle_runtime::{EndReason, Outcome, SessionEnd};
use settle_store::MemoryStore;
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

// Its own test binary: a thread-local subscriber shares tracing's global
// callsite cache with every other test of a binary, whose spans on other
// threads made this one flaky.
#[path = "lifecycle/common.rs"]
#[allow(dead_code)]
mod common;

use common::*;

/// A span as recorded: its name, its fields, its parent's name and fields.
#[derive(Debug, Clone)]
struct Seen {
    name: &'static str,
    fields: String,
    parent: Option<(&'static str, String)>,
}

/// The spans seen, and each span's fields by its id.
type Log = (Vec<Seen>, HashMap<u64, String>);

#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Log>>);

struct Fields(String);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.push_str(&format!("{}={:?} ", field.name(), value));
    }
}

impl<S: tracing::Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields(String::new());
        attrs.record(&mut fields);
        let mut seen = self.0.lock().unwrap();
        seen.1.insert(id.into_u64(), fields.0.clone());
        let parent = ctx.span(id).and_then(|s| s.parent()).map(|p| {
            let parent_fields = seen.1.get(&p.id().into_u64()).cloned().unwrap_or_default();
            (p.name(), parent_fields)
        });
        seen.0.push(Seen {
            name: attrs.metadata().name(),
            fields: fields.0,
            parent,
        });
    }
}

#[tokio::test(start_paused = true)]
async fn turns_tasks_finalizes_and_hooks_run_inside_their_session_span() {
    let recorder = Recorder::default();
    let subscriber = tracing_subscriber::registry().with(recorder.clone());
    let _default = tracing::subscriber::set_default(subscriber);

    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b.on_session_end(|_: SessionEnd| {})).await;
    let root = kernel.register("root", None).await.unwrap();
    let agent = kernel.register("agent", Some(root.id())).await.unwrap();
    let p = provider([complete(&["a"], Duration::from_millis(1))]);
    assert_eq!(start(&agent, &p).await.outcome().await, Outcome::Completed);
    let task = agent.spawn(|_| async { 1 }).await.unwrap();
    assert_eq!(task.join().await, Ok(1));
    assert_eq!(agent.finish().await.unwrap(), EndReason::Completed);
    settle_tasks().await;

    let seen = recorder.0.lock().unwrap().0.clone();
    let agent_fields = format!("id={} name=agent parent={} ", agent.id().0, root.id().0);
    let session = seen
        .iter()
        .find(|s| s.name == "session" && s.fields == agent_fields)
        .unwrap_or_else(|| panic!("no session span with {agent_fields:?}: {seen:#?}"));
    assert!(
        session.parent.is_none(),
        "a session span is a root: {session:?}"
    );
    for child in ["turn", "task", "finalize", "on_session_end"] {
        let found = seen.iter().find(|s| {
            s.name == child
                && s.parent
                    .as_ref()
                    .is_some_and(|(name, fields)| *name == "session" && *fields == agent_fields)
        });
        assert!(
            found.is_some(),
            "no {child} span inside the agent's session: {seen:#?}"
        );
    }
    let turn = seen.iter().find(|s| s.name == "turn").unwrap();
    assert_eq!(turn.fields, "no=1 ");
    kernel.shutdown(Duration::ZERO).await;
}
