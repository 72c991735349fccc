//! [`EventBus`]: the fan-out of [`LifecycleEvent`]s, to the kernel's
//! subscribers and to those of the session an event is about.

use crate::event::LifecycleEvent;
use crate::shared::SessionShared;

/// Sends lifecycle events to the kernel's subscribers and to the subscribers
/// of the session they are about; builds none when nobody listens.
#[derive(Debug, Clone)]
pub(crate) struct EventBus {
    all: tokio::sync::broadcast::Sender<LifecycleEvent>,
}

impl EventBus {
    /// How many events a kernel-wide subscriber may fall behind.
    const CAPACITY: usize = 16 * 1024;

    pub fn new() -> Self {
        EventBus {
            all: tokio::sync::broadcast::channel(Self::CAPACITY).0,
        }
    }

    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<LifecycleEvent> {
        self.all.subscribe()
    }

    /// Emits the event `make` builds, to everyone and to `session`'s subscribers.
    pub fn emit(&self, session: Option<&SessionShared>, make: impl FnOnce() -> LifecycleEvent) {
        let everyone = self.all.receiver_count() > 0;
        let watched = session.is_some_and(|s| s.is_watched());
        if !everyone && !watched {
            return;
        }
        let event = make();
        if let Some(s) = session.filter(|_| watched) {
            s.publish(&event);
        }
        if everyone {
            let _ = self.all.send(event);
        }
    }
}
