//! A connection's bounded queue of frames to send.
//!
//! Everything a connection is sent (answers, notifications, pings, the
//! closing frame) goes through its outbox, to one writer task. Pushing never
//! waits: a turn fanning its chunks out to every watcher must not be slowed
//! by the slowest of them. When a client does not read and its queue is full
//! (in frames or in bytes), the push fails and the connection is cut: its
//! socket is closed and its transports detached, as for any dropped
//! connection. So a slow client costs at most its queue's bounds.
//!
//! The outbox is also how a session's end reaches the connection's task: a
//! session it watched that is finalized is no longer one it is attached to
//! (see [`Outbox::finalized`]).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::ws::Utf8Bytes;
use settle_runtime::SessionId;
use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use crate::closing::Closing;

/// One frame to send.
#[derive(Debug)]
pub(crate) enum Frame {
    /// A JSON-RPC message.
    Text(Utf8Bytes),
    /// The messages of one chunk sent in parts, one frame each, shared by
    /// every connection watching its session.
    Parts(Arc<[Utf8Bytes]>),
    /// A keepalive ping.
    Ping,
    /// The closing frame, saying why the gateway ends the connection.
    Close(Closing),
}

impl Frame {
    fn weight(&self) -> usize {
        match self {
            Frame::Text(text) => text.len(),
            // The parts are shared by every watcher and held by the turn's
            // chunk anyway: a connection's queue is charged its largest
            // part, the most it holds of them in a socket's buffer at once.
            Frame::Parts(parts) => parts.iter().map(|part| part.len()).max().unwrap_or(0),
            Frame::Ping | Frame::Close(_) => 0,
        }
    }
}

/// The bounds of one connection's queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    pub frames: usize,
    pub bytes: usize,
}

/// The sending side of a connection's queue. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Outbox {
    tx: mpsc::Sender<Frame>,
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    queued: AtomicUsize,
    max_bytes: usize,
    /// Cancelled when the connection must end: its queue overflowed, or the
    /// gateway closes it.
    cut: CancellationToken,
    /// Cancelled when the gateway asks the connection to end once the
    /// request it is answering is answered (a shutdown's close).
    closing: CancellationToken,
    /// The sessions the connection watched that were finalized since its
    /// task last took them: at most the sessions it attached to.
    finalized: Mutex<Vec<SessionId>>,
    /// Wakes the connection's task when one is added.
    finalized_added: Notify,
}

/// The writer's side of the queue.
#[derive(Debug)]
pub(crate) struct Inbox {
    rx: mpsc::Receiver<Frame>,
    shared: Arc<Shared>,
}

/// A queue within `bounds`.
pub(crate) fn channel(bounds: Bounds) -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::channel(bounds.frames.max(1));
    let shared = Arc::new(Shared {
        queued: AtomicUsize::new(0),
        max_bytes: bounds.bytes,
        cut: CancellationToken::new(),
        closing: CancellationToken::new(),
        finalized: Mutex::default(),
        finalized_added: Notify::new(),
    });
    (
        Outbox {
            tx,
            shared: shared.clone(),
        },
        Inbox { rx, shared },
    )
}

impl Outbox {
    /// Queues `frame` without waiting. A full queue cuts the connection and
    /// returns `false`; so does a connection already gone.
    pub fn push(&self, frame: Frame) -> bool {
        let weight = frame.weight();
        let before = self.shared.queued.fetch_add(weight, Ordering::Relaxed);
        if before.saturating_add(weight) > self.shared.max_bytes {
            self.shared.queued.fetch_sub(weight, Ordering::Relaxed);
            self.overflowed();
            return false;
        }
        match self.tx.try_send(frame) {
            Ok(()) => true,
            Err(error) => {
                self.shared.queued.fetch_sub(weight, Ordering::Relaxed);
                if matches!(error, mpsc::error::TrySendError::Full(_)) {
                    self.overflowed();
                }
                false
            }
        }
    }

    /// Queues a JSON-RPC message.
    pub fn text(&self, text: impl Into<Utf8Bytes>) -> bool {
        self.push(Frame::Text(text.into()))
    }

    fn overflowed(&self) {
        if !self.shared.cut.is_cancelled() {
            tracing::warn!("a client does not keep up with its notifications; disconnecting it");
            self.shared.cut.cancel();
        }
    }

    /// Ends the connection now, whatever is queued.
    pub fn cut(&self) {
        self.shared.cut.cancel();
    }

    /// Resolves once the connection must end.
    pub fn is_cut(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.shared.cut.cancelled()
    }

    /// Asks the connection to end with its closing frame once the request
    /// it is answering, if any, is answered: its answer goes out first.
    pub fn ask_to_close(&self) {
        self.shared.closing.cancel();
    }

    /// Resolves once the gateway asked the connection to end.
    pub fn asked_to_close(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.shared.closing.cancelled()
    }

    /// Tells the connection's task that session `id`, which it watched, is
    /// finalized: the connection is attached to it no more.
    pub fn finalized(&self, id: SessionId) {
        self.finalized_sessions().push(id);
        // A permit is kept when the task is not waiting: it is not missed.
        self.shared.finalized_added.notify_one();
    }

    /// Resolves with the sessions the connection watched that were
    /// finalized since the last call, once there is one.
    pub async fn finalized_since(&self) -> Vec<SessionId> {
        loop {
            let taken = std::mem::take(&mut *self.finalized_sessions());
            if !taken.is_empty() {
                return taken;
            }
            self.shared.finalized_added.notified().await;
        }
    }

    fn finalized_sessions(&self) -> std::sync::MutexGuard<'_, Vec<SessionId>> {
        self.shared
            .finalized
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the connection must end.
    #[cfg(test)]
    pub fn was_cut(&self) -> bool {
        self.shared.cut.is_cancelled()
    }
}

impl Inbox {
    /// Takes up to `limit` frames, waiting for the first; `None` once every
    /// outbox is dropped.
    pub async fn next_batch(&mut self, into: &mut Vec<Frame>, limit: usize) -> Option<()> {
        let n = self.rx.recv_many(into, limit).await;
        if n == 0 {
            return None;
        }
        let weight: usize = into.iter().map(Frame::weight).sum();
        self.shared.queued.fetch_sub(weight, Ordering::Relaxed);
        Some(())
    }

    /// What cancels when the connection must end.
    pub fn cut_token(&self) -> CancellationToken {
        self.shared.cut.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_cuts_the_connection_instead_of_waiting() {
        let (outbox, _inbox) = channel(Bounds {
            frames: 2,
            bytes: 1 << 20,
        });
        assert!(outbox.text("one"));
        assert!(outbox.text("two"));
        assert!(!outbox.was_cut());
        assert!(!outbox.text("three"));
        assert!(outbox.was_cut());
    }

    #[test]
    fn the_byte_bound_cuts_too_and_draining_frees_it() {
        let (outbox, mut inbox) = channel(Bounds {
            frames: 100,
            bytes: 10,
        });
        assert!(outbox.text("12345"));
        assert!(outbox.text("12345"));
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let mut frames = Vec::new();
        rt.block_on(inbox.next_batch(&mut frames, 10));
        assert_eq!(frames.len(), 2);
        assert!(outbox.text("1234567890"));
        assert!(!outbox.was_cut());
        assert!(!outbox.text("x"));
        assert!(outbox.was_cut());
    }
}
