use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::FutureExt;
use settle_core::{EndReason, SessionId};
use tokio::sync::oneshot;

/// What the `on_session_end` hook is told (SPEC §4 step 4).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
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
    /// Whether its row was ended in the store. `false` when the store did
    /// not take the end (a stalled store at shutdown, a lost lease): the
    /// session is done in this process, but its row is left live for
    /// `settle recover` (or a fleet's peer), which ends it `recovered` (G8).
    /// The hook fires all the same (SPEC §4: each step best-effort).
    pub row_ended: bool,
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

/// Runs `on_session_end` hooks off the recorder's path: each on its own
/// task (a panic stays there), at most `concurrency` at once, each bounded by
/// the hook timeout. A session's hook fires once, after its row is ended, so
/// per-session order holds by construction; and the hooks start in the
/// order they were fired (a tree's children first, G1): each task waits
/// until the one fired before it has polled its hook once, whatever order
/// the runtime polls the tasks in (the task spawned last often runs first).
#[derive(Clone)]
pub(crate) struct HookRunner {
    hook: Option<Arc<dyn SessionEndHook>>,
    limit: Duration,
    permits: Arc<tokio::sync::Semaphore>,
    /// Told once the hook fired last has started (or its task is gone).
    last_started: Arc<std::sync::Mutex<Option<oneshot::Receiver<()>>>>,
    /// Cancelled once a shutdown's budget is spent: a hook still waiting
    /// for the concurrency limit starts without it.
    rush: tokio_util::sync::CancellationToken,
    /// The hooks fired that have not returned, and those of them waiting
    /// for the kernel's shutdown.
    calls: Arc<HookCalls>,
}

/// The hooks of one kernel in flight: how many were fired and have not
/// returned (or been given up on), and how many of those are waiting in a
/// [`Kernel::shutdown`](crate::Kernel::shutdown) they called themselves,
/// which waits for every hook but them.
#[derive(Debug, Default)]
pub(crate) struct HookCalls {
    unreturned: AtomicUsize,
    in_shutdown: AtomicUsize,
    /// Told whenever either count goes down or `in_shutdown` goes up.
    changed: tokio::sync::Notify,
}

tokio::task_local! {
    /// The calls of the kernel whose hook the current task is running.
    static RUNNING_HOOK_OF: Arc<HookCalls>;
}

impl HookCalls {
    /// How many hooks a shutdown still waits for.
    fn awaited(&self) -> usize {
        self.unreturned
            .load(Ordering::SeqCst)
            .saturating_sub(self.in_shutdown.load(Ordering::SeqCst))
    }

    /// When the current task is one of these hooks, counts it as waiting
    /// for the shutdown until the guard is dropped; `None` otherwise (a
    /// hook of another kernel, or no hook at all).
    pub fn shutdown_asked_by_own_hook(self: &Arc<Self>) -> Option<InShutdown> {
        let own = RUNNING_HOOK_OF
            .try_with(|running| Arc::ptr_eq(running, self))
            .unwrap_or(false);
        if !own {
            return None;
        }
        self.in_shutdown.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
        Some(InShutdown(self.clone()))
    }
}

/// A hook waiting in the shutdown it asked for, counted in `in_shutdown`
/// until dropped.
pub(crate) struct InShutdown(Arc<HookCalls>);

impl Drop for InShutdown {
    fn drop(&mut self) {
        self.0.in_shutdown.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// One hook fired and not yet returned, counted in `unreturned` until
/// dropped.
struct Unreturned(Arc<HookCalls>);

impl Unreturned {
    fn new(calls: &Arc<HookCalls>) -> Self {
        calls.unreturned.fetch_add(1, Ordering::SeqCst);
        Unreturned(calls.clone())
    }
}

impl Drop for Unreturned {
    fn drop(&mut self) {
        self.0.unreturned.fetch_sub(1, Ordering::SeqCst);
        self.0.changed.notify_waiters();
    }
}

/// Once a shutdown's budget is spent, how long it waits for the hooks
/// fired so far to start (each waits for the one fired before it to start,
/// a poll away): every hook is called before the shutdown returns.
const START_GRACE: Duration = Duration::from_millis(50);

impl HookRunner {
    pub fn new(hook: Option<Arc<dyn SessionEndHook>>, limit: Duration, concurrency: usize) -> Self {
        HookRunner {
            hook,
            limit,
            permits: Arc::new(tokio::sync::Semaphore::new(concurrency.max(1))),
            last_started: Arc::default(),
            rush: tokio_util::sync::CancellationToken::new(),
            calls: Arc::default(),
        }
    }

    /// Whether a hook is set: without one, nothing needs to build a
    /// [`SessionEnd`] (a teardown would allocate a name per session for
    /// nobody).
    pub fn is_set(&self) -> bool {
        self.hook.is_some()
    }

    /// Fires the hook for `end`, without waiting for it.
    pub fn fire(&self, session: Option<tracing::Span>, end: SessionEnd) {
        let Some(hook) = self.hook.clone() else {
            return;
        };
        let (permits, limit, rush) = (self.permits.clone(), self.limit, self.rush.clone());
        let span = match session {
            Some(session) => tracing::info_span!(parent: &session, "on_session_end"),
            None => tracing::info_span!("on_session_end", session = end.session.0),
        };
        let unreturned = Unreturned::new(&self.calls);
        let calls = self.calls.clone();
        let (started, starts) = oneshot::channel();
        let before = self
            .last_started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .replace(starts);
        tokio::spawn(tracing::Instrument::instrument(
            async move {
                if let Some(before) = before {
                    // Sent, or its task is gone: either way it is no longer first.
                    let _ = before.await;
                }
                // Past a shutdown's budget, without waiting for a permit.
                let _permit = tokio::select! {
                    biased;
                    permit = permits.acquire_owned() => match permit {
                        Ok(permit) => Some(permit),
                        Err(_) => return,
                    },
                    () = rush.cancelled() => None,
                };
                let session = end.session;
                let call = RUNNING_HOOK_OF.scope(calls, hook.on_session_end(end));
                let call = std::panic::AssertUnwindSafe(call).catch_unwind();
                let mut call = std::pin::pin!(tokio::time::timeout(limit, call));
                // Its first poll is its start: the next hook waits for it.
                let first = futures_util::poll!(call.as_mut());
                let ended = match first {
                    std::task::Poll::Ready(ended) => {
                        // Returned before it is said started: a shutdown
                        // told of its start does not count it running.
                        drop(unreturned);
                        let _ = started.send(());
                        ended
                    }
                    std::task::Poll::Pending => {
                        let _ = started.send(());
                        let ended = call.await;
                        drop(unreturned);
                        ended
                    }
                };
                match ended {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => {
                        tracing::warn!(%session, "on_session_end hook panicked; carrying on")
                    }
                    Err(_) => {
                        tracing::warn!(%session, ?limit, "on_session_end hook overran its timeout; abandoned")
                    }
                }
            },
            span,
        ));
    }

    /// Waits until every hook fired so far has returned, or `until`; then
    /// starts those still waiting for the concurrency limit and waits (up
    /// to [`START_GRACE`]) until every one has started, so that none is
    /// called after the shutdown returns. Returns how many were still
    /// running then (abandoned).
    pub async fn settle(&self, until: tokio::time::Instant) -> usize {
        let all_returned = async {
            loop {
                let changed = self.calls.changed.notified();
                let mut changed = std::pin::pin!(changed);
                changed.as_mut().enable();
                // A hook waiting in this very shutdown is not waited for: it
                // would wait for the shutdown, and the shutdown for it.
                if self.calls.awaited() == 0 {
                    return;
                }
                changed.await;
            }
        };
        if tokio::time::timeout_at(until, all_returned).await.is_ok() {
            return 0;
        }
        self.rush.cancel();
        let last = self
            .last_started
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        if let Some(last) = last {
            let _ = tokio::time::timeout(START_GRACE, last).await;
        }
        self.calls.awaited()
    }

    /// The count of this kernel's hooks in flight, which its shutdown reads.
    pub fn calls(&self) -> Arc<HookCalls> {
        self.calls.clone()
    }
}
