//! The live connections of a gateway: what it tells them all (a shutdown
//! under way, that it is closing).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use axum::extract::ws::Utf8Bytes;
use tokio_util::task::TaskTracker;

use crate::outbox::Outbox;
use crate::table::ConnId;

/// The live connections, for what the gateway tells them all.
#[derive(Debug, Default)]
pub(crate) struct Connections {
    next: AtomicU64,
    registry: Mutex<Registry>,
    /// Every connection's task.
    pub tracker: TaskTracker,
}

#[derive(Debug, Default)]
struct Registry {
    live: HashMap<ConnId, Outbox>,
    /// The `server.shutdown` notification, once it was sent.
    shutdown: Option<Utf8Bytes>,
    /// Set once the gateway closes every connection.
    closing: bool,
}

impl Connections {
    fn registry(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a new connection; it is told at once what the others were
    /// (a shutdown under way, the gateway closing).
    pub fn join(&self, outbox: &Outbox) -> ConnId {
        let conn = ConnId(self.next.fetch_add(1, Ordering::Relaxed) + 1);
        let mut registry = self.registry();
        if let Some(frame) = &registry.shutdown {
            outbox.text(frame.clone());
        }
        if registry.closing {
            outbox.ask_to_close();
        }
        registry.live.insert(conn, outbox.clone());
        conn
    }

    pub fn leave(&self, conn: ConnId) {
        self.registry().live.remove(&conn);
    }

    /// Sends `frame` (the `server.shutdown` notification) to every
    /// connection, once, and to every later one as it arrives.
    pub fn announce_shutdown(&self, frame: impl FnOnce() -> Utf8Bytes) {
        let mut registry = self.registry();
        if registry.shutdown.is_some() {
            return;
        }
        let frame = frame();
        for outbox in registry.live.values() {
            outbox.text(frame.clone());
        }
        registry.shutdown = Some(frame);
    }

    /// Asks every connection to send its closing frame, after what is
    /// queued and the answer to the request it is answering (a request in
    /// flight is answered, within the closing grace, not dropped).
    pub fn close_all(&self) {
        let mut registry = self.registry();
        registry.closing = true;
        for outbox in registry.live.values() {
            outbox.ask_to_close();
        }
    }

    /// Ends every connection now.
    pub fn cut_all(&self) {
        for outbox in self.registry().live.values() {
            outbox.cut();
        }
    }

    /// How many connections are live.
    pub fn len(&self) -> usize {
        self.registry().live.len()
    }
}
