use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use settle_core::{EndReason, SessionId};

/// What the `on_session_end` hook is told (SPEC §4 step 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionEnd {
    /// The session that ended.
    pub session: SessionId,
    /// Its name.
    pub name: String,
    /// Why it ended.
    pub reason: EndReason,
    /// Its last turn completed, so its transcript is whole.
    pub completed: bool,
    /// Its last turn was cut short (cancelled, detached, crashed).
    pub interrupted: bool,
}

/// A frontend's hook, fired exactly once per session when it is finalized.
///
/// A hook that fails, panics or outlives [`Config::hook_timeout`](crate::Config::hook_timeout)
/// is logged and abandoned; it never blocks the rest of the finalize plan or
/// the shutdown.
#[async_trait]
pub trait SessionEndHook: Send + Sync + 'static {
    /// Called once per finalized session.
    async fn on_session_end(&self, end: SessionEnd);
}

#[async_trait]
impl<F> SessionEndHook for F
where
    F: Fn(SessionEnd) + Send + Sync + 'static,
{
    async fn on_session_end(&self, end: SessionEnd) {
        self(end)
    }
}

/// Why a hook call did not finish normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HookFailure {
    Panicked,
    TimedOut,
}

/// Runs the hook in its own task, so a panic stays there, bounded by `limit`.
pub(crate) async fn fire(
    hook: Arc<dyn SessionEndHook>,
    end: SessionEnd,
    limit: Duration,
) -> Result<(), HookFailure> {
    let task = tokio::spawn(async move {
        std::panic::AssertUnwindSafe(hook.on_session_end(end))
            .catch_unwind()
            .await
    });
    let abort = task.abort_handle();
    match tokio::time::timeout(limit, task).await {
        Ok(Ok(Ok(()))) => Ok(()),
        Ok(Ok(Err(_))) | Ok(Err(_)) => Err(HookFailure::Panicked),
        Err(_) => {
            abort.abort();
            Err(HookFailure::TimedOut)
        }
    }
}
