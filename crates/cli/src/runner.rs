//! Runs a scenario's agent tree on a kernel: each agent registers under its
//! parent after its spawn delay, plays its scripted turns, then finishes. The
//! run ends when the root has finished and every session is finalized.
//!
//! Every wait of the runner gives way to a shutdown: an agent still waiting
//! to spawn gives up at once, an agent between turns starts no more, and an
//! agent in a turn reads it to its end (the drain, or its cancel).
//!
//! An agent still waiting to spawn when its parent finishes never spawns
//! (nor do its own children): finishing winds the parent's subtree down, so
//! the run does not wait out a spawn delay once the tree is settled.

use std::sync::Arc;

use settle_runtime::{Kernel, Outcome, SessionHandle, SessionId, TurnRequest};
use settle_stream::{CancellationToken, ScriptedProvider, TurnScript};
use tokio::task::JoinSet;

use crate::scenario::{AgentSpec, Scenario, TurnSpec};

/// What the run of the root agent came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootResult {
    /// The root's session.
    pub session: SessionId,
    /// The outcome of the root's last turn.
    pub outcome: Option<Outcome>,
}

impl RootResult {
    /// `settle run` exits 1 when the root's last turn failed or timed out.
    pub fn failed(&self) -> bool {
        matches!(self.outcome, Some(Outcome::Failed | Outcome::IdleTimeout))
    }
}

/// Plays `scenario` on `kernel` until the root is finalized and every agent
/// task is done. Returns `None` when the root could not even register
/// (shutdown began first).
pub async fn run(scenario: Arc<Scenario>, kernel: Kernel) -> Option<RootResult> {
    let root = scenario.root().clone();
    let mut agents = JoinSet::new();
    let result = run_agent(scenario, kernel, root, None, &mut agents).await;
    // Agents still waiting to spawn give up as soon as a shutdown begins or
    // their parent is gone.
    while agents.join_next().await.is_some() {}
    result
}

fn boxed_agent(
    scenario: Arc<Scenario>,
    kernel: Kernel,
    spec: AgentSpec,
    parent: SessionId,
    parent_finishing: CancellationToken,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    Box::pin(async move {
        tokio::select! {
            biased;
            () = kernel.shutdown_begun() => return,
            () = parent_finishing.cancelled() => return,
            () = tokio::time::sleep(spec.spawn_after) => {}
        }
        let mut grandchildren = JoinSet::new();
        run_agent(scenario, kernel, spec, Some(parent), &mut grandchildren).await;
        while grandchildren.join_next().await.is_some() {}
    })
}

async fn run_agent(
    scenario: Arc<Scenario>,
    kernel: Kernel,
    spec: AgentSpec,
    parent: Option<SessionId>,
    children: &mut JoinSet<()>,
) -> Option<RootResult> {
    let session = match kernel.register(spec.name.clone(), parent).await {
        Ok(session) => session,
        Err(error) => {
            tracing::info!(agent = %spec.name, %error, "agent not started");
            return None;
        }
    };
    // Cancelled once this agent's turns are over, whatever ends them (a drop
    // included): its children still waiting to spawn give up.
    let finishing = CancellationToken::new();
    let _finishing = finishing.clone().drop_guard();
    for child in scenario.children(&spec.name) {
        children.spawn(boxed_agent(
            scenario.clone(),
            kernel.clone(),
            child.clone(),
            session.id(),
            finishing.clone(),
        ));
    }
    let outcome = play_turns(&session, &spec).await;
    finishing.cancel();
    // Finishing winds the subtree down first (G1); during a shutdown's drain
    // it leaves the children's running turns to the drain (G9).
    if let Err(error) = session.finish().await {
        tracing::debug!(agent = %spec.name, %error, "finish after the session closed");
    }
    Some(RootResult {
        session: session.id(),
        outcome,
    })
}

async fn play_turns(session: &SessionHandle, spec: &AgentSpec) -> Option<Outcome> {
    let provider = Arc::new(ScriptedProvider::new(spec.turns.iter().map(script)));
    let mut last = None;
    for (no, _) in spec.turns.iter().enumerate() {
        let request = TurnRequest::prompt(format!("{} turn {}", spec.name, no + 1));
        let mut turn = match session.run_turn(provider.clone(), request).await {
            Ok(turn) => turn,
            // Closing, cancelled or shutting down: this agent plays no more.
            Err(_) => break,
        };
        while turn.next_chunk().await.is_some() {}
        let outcome = turn.outcome().await;
        last = Some(outcome);
        if matches!(outcome, Outcome::Detached | Outcome::Interrupted) {
            break;
        }
    }
    last
}

/// The scripted provider's script for one turn of the file.
pub fn script(turn: &TurnSpec) -> TurnScript {
    TurnScript::new(turn.chunks.iter().cloned())
        .chunk_delay(turn.chunk_delay)
        .end(turn.end)
        .close_delay(turn.close_delay)
        .ignore(turn.ignore)
}
