//! [`SessionGuard`]: the session's end on every exit path of the agent's code,
//! and [`SessionHandle::guard`], which wraps a handle in one (here, so that
//! the session's module does not import the guard's).

use std::ops::Deref;

use settle_core::{EndReason, Event};

use crate::error::RuntimeError;
use crate::session::SessionHandle;

/// A [`SessionHandle`] that cancels its session when dropped, unless it was
/// finished (or given back) first: a `?` early return or a panic in the
/// agent's code still winds the session's subtree down, children first (G1).
/// Dropped after a shutdown began, it leaves the session and its subtree to
/// the shutdown: running turns keep the drain, then everything is finalized
/// `shutdown` (G9).
/// Like tokio-util's `DropGuard`, the drop queues the command synchronously;
/// the kernel does the rest.
///
/// ```
/// # async fn agent(kernel: settle_runtime::Kernel) -> Result<(), Box<dyn std::error::Error>> {
/// let root = kernel.register("root", None).await?.guard();
/// let child = kernel.register("child", Some(root.id())).await?.guard();
/// // ... work that may fail with `?` or panic: the guards cancel on the way out ...
/// child.finish().await?;
/// root.finish().await?;
/// # Ok(()) }
/// ```
#[derive(Debug)]
#[must_use = "dropping the guard cancels the session at once"]
pub struct SessionGuard {
    handle: SessionHandle,
    armed: bool,
}

impl SessionGuard {
    pub(crate) fn new(handle: SessionHandle) -> Self {
        SessionGuard {
            handle,
            armed: true,
        }
    }

    /// The agent is done: finishes the session (see [`SessionHandle::finish`])
    /// instead of cancelling it.
    ///
    /// # Errors
    /// As [`SessionHandle::finish`].
    pub async fn finish(self) -> Result<EndReason, RuntimeError> {
        self.into_inner().finish().await
    }

    /// Gives the handle back without ending the session (tokio-util's
    /// `DropGuard::disarm`): dropping it afterwards does nothing.
    pub fn disarm(mut self) -> SessionHandle {
        self.armed = false;
        self.handle.clone()
    }

    /// The same as [`disarm`](Self::disarm).
    pub fn into_inner(self) -> SessionHandle {
        self.disarm()
    }
}

impl SessionHandle {
    /// Wraps this handle in a guard that cancels the session (and winds its
    /// subtree down, children first) when it is dropped without
    /// [`SessionGuard::finish`]: on an early `?` return or a panic in the
    /// agent's code.
    pub fn guard(self) -> SessionGuard {
        SessionGuard::new(self)
    }
}

impl Deref for SessionGuard {
    type Target = SessionHandle;

    fn deref(&self) -> &SessionHandle {
        &self.handle
    }
}

impl Drop for SessionGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        if std::thread::panicking() {
            tracing::warn!(session = %self.handle.id(), "the agent panicked; cancelling its session");
        }
        // The core decides what letting go means now (a cancel, or nothing
        // during a shutdown).
        self.handle.send_now(Event::Abandoned {
            session: self.handle.id(),
        });
    }
}
