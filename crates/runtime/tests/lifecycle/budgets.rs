//! Budgets through the runtime: set at registration, inherited by children,
//! counted from usage chunks, turns and wall time; exceeding one cancels
//! the subtree (G1) and finalizes it `budget_exhausted`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{stream, StreamExt};
use serde_json::json;
use settle_runtime::{Budget, BudgetLimit, EndReason, RuntimeError, TurnRequest};
use settle_store::MemoryStore;
use settle_stream::{
    Chunk, ChunkKind, DropClose, Provider, ProviderStream, Request, StreamError, StreamEvent,
};

use crate::common::*;

const S: Duration = Duration::from_secs(1);

/// Reports `tokens` of usage, then stays open: a long reply reporting as
/// it streams, or (`finished`) a whole reply, said whole by its provider (a
/// finish reason), its usage after it, waiting for the stream's end
/// (`data: [DONE]`).
struct Spender {
    tokens: u64,
    finished: bool,
}

#[async_trait]
impl Provider for Spender {
    async fn open(&self, _: &Request) -> Result<ProviderStream, StreamError> {
        let usage = Chunk::json(ChunkKind::Usage, &json!({"total_tokens": self.tokens}));
        let finished = self.finished.then_some(Ok(StreamEvent::Finished(None)));
        let events = stream::iter(
            [Ok(StreamEvent::Chunk(Chunk::text("the answer")))]
                .into_iter()
                .chain(finished)
                .chain([Ok(StreamEvent::Chunk(usage))]),
        )
        .chain(stream::pending());
        Ok(Box::new(DropClose::new(events)))
    }
}

/// A reply its provider said is done, whose stream then goes quiet (a
/// server that sends neither `[DONE]` nor a close after its finish
/// reason): found from outside to end `idle_timeout`, the whole reply left
/// out of the conversation, and a cut one not said to be cut. It ends as
/// its provider said: `completed` when whole, `failed` (truncated) when
/// cut.
#[tokio::test(start_paused = true)]
async fn g7_a_reply_said_done_that_then_goes_quiet_ends_as_its_provider_said() {
    struct Quiet(Option<settle_stream::Truncation>);
    #[async_trait]
    impl Provider for Quiet {
        async fn open(&self, _: &Request) -> Result<ProviderStream, StreamError> {
            let events = stream::iter([
                Ok(StreamEvent::Chunk(Chunk::text("the answer"))),
                Ok(StreamEvent::Finished(self.0)),
            ])
            .chain(stream::pending());
            Ok(Box::new(DropClose::new(events)))
        }
    }
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b.idle_timeout(Some(2 * S))).await;
    let session = kernel.register("agent", None).await.unwrap();
    let whole = session
        .run_turn(Arc::new(Quiet(None)), TurnRequest::prompt("go"))
        .await
        .unwrap();
    assert_eq!(whole.outcome().await, settle_runtime::Outcome::Completed);
    let cut = Some(settle_stream::Truncation::Length);
    let turn = session
        .run_turn(Arc::new(Quiet(cut)), TurnRequest::prompt("go"))
        .await
        .unwrap();
    let (outcome, error) = turn.end().await;
    assert_eq!(outcome, settle_runtime::Outcome::Failed);
    let error = error.expect("a cut reply says why");
    assert_eq!(
        error.kind,
        settle_runtime::TurnErrorKind::Truncated,
        "{error}"
    );
    kernel.shutdown(Duration::ZERO).await;
}

/// Found from outside: a provider sends a reply's usage after its last
/// content and before the stream's end, so a usage report that exhausted
/// a budget cancelled the very reply it closed: the whole answer was
/// recorded `cancelled` and its memory not committed. A reply its
/// provider said is whole ends `completed`; the subtree is wound down
/// `budget_exhausted` all the same, and a sibling mid-turn is cancelled.
#[tokio::test(start_paused = true)]
async fn g1_a_whole_reply_whose_own_usage_exhausts_the_budget_ends_completed() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let root = kernel
        .register_with_budget("root", None, Budget::default().tokens(100))
        .await
        .unwrap();
    let sibling = root.child("sibling").await.unwrap();
    let mut running = sibling
        .run_turn(
            Arc::new(Spender {
                tokens: 0,
                finished: false,
            }),
            TurnRequest::prompt("go"),
        )
        .await
        .unwrap();
    let child = root.child("worker").await.unwrap();
    let mut turn = child
        .run_turn(
            Arc::new(Spender {
                tokens: 150,
                finished: true,
            }),
            TurnRequest::prompt("go"),
        )
        .await
        .unwrap();
    while turn.next_chunk().await.is_some() {}
    assert_eq!(turn.outcome().await, settle_runtime::Outcome::Completed);
    while running.next_chunk().await.is_some() {}
    assert_eq!(running.outcome().await, settle_runtime::Outcome::Cancelled);
    assert_eq!(child.finalized().await.unwrap(), EndReason::BudgetExhausted);
    assert_eq!(root.finalized().await.unwrap(), EndReason::BudgetExhausted);
    let d = detail(&store, child.id()).await;
    assert_eq!(d.turns[0].outcome, Some(settle_runtime::Outcome::Completed));
}

#[tokio::test(start_paused = true)]
async fn g1_tokens_past_a_budget_cancel_the_subtree_and_finalize_it_budget_exhausted() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let root = kernel
        .register_with_budget("root", None, Budget::default().tokens(100))
        .await
        .unwrap();
    let child = root.child("worker").await.unwrap();
    let mut events = kernel.subscribe();
    // The child's usage counts against the root's budget.
    let mut turn = child
        .run_turn(
            Arc::new(Spender {
                tokens: 150,
                finished: false,
            }),
            TurnRequest::prompt("go"),
        )
        .await
        .unwrap();
    while turn.next_chunk().await.is_some() {}
    assert_eq!(turn.outcome().await, settle_runtime::Outcome::Cancelled);
    assert_eq!(root.finalized().await.unwrap(), EndReason::BudgetExhausted);
    assert_eq!(child.finalized().await.unwrap(), EndReason::BudgetExhausted);
    let order = finalized(&drain(&mut events));
    assert!(position(&order, child.id()) < position(&order, root.id()));
    let row = detail(&store, root.id()).await.session;
    assert_eq!(row.end_reason, Some(EndReason::BudgetExhausted));
}

#[tokio::test(start_paused = true)]
async fn the_turn_past_a_turn_budget_is_refused_and_the_session_ends() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let agent = kernel
        .register_with_budget("agent", None, Budget::default().turns(1))
        .await
        .unwrap();
    let script = provider([
        complete(&["one"], Duration::ZERO),
        complete(&["two"], Duration::ZERO),
    ]);
    let first = start(&agent, &script).await;
    assert_eq!(first.outcome().await, settle_runtime::Outcome::Completed);
    let refused = agent
        .run_turn(script.clone(), TurnRequest::prompt("again"))
        .await;
    assert!(
        matches!(
            refused,
            Err(RuntimeError::Lifecycle(
                settle_core::Error::BudgetExhausted {
                    limit: BudgetLimit::Turns,
                    ..
                }
            ))
        ),
        "{refused:?}"
    );
    assert_eq!(agent.finalized().await.unwrap(), EndReason::BudgetExhausted);
    assert_eq!(script.stats().opened, 1);
}

#[tokio::test(start_paused = true)]
async fn a_wall_time_budget_ends_a_hung_subtree_on_the_paused_clock() {
    let store = MemoryStore::new();
    let kernel = runtime_on(&store, |b| b).await;
    let root = kernel
        .register_with_budget("root", None, Budget::default().wall_time(60 * S))
        .await
        .unwrap();
    let child = root.child("hung").await.unwrap();
    let hung = provider([hang(&["a"], Duration::ZERO)]);
    let _turn = start(&child, &hung).await;
    let began = tokio::time::Instant::now();
    assert_eq!(child.finalized().await.unwrap(), EndReason::BudgetExhausted);
    assert_eq!(root.finalized().await.unwrap(), EndReason::BudgetExhausted);
    assert!(began.elapsed() >= 60 * S && began.elapsed() < 62 * S);
    assert_eq!(hung.stats().close_finished, 1, "its stream was closed (G4)");
}
