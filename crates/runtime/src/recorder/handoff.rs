//! A session handed off (SPEC §12): released in the store for another
//! process to adopt, once every write before it is committed (it is a
//! barrier), so the row is idle when it is released.

use std::time::SystemTime;

use settle_core::{Holds, SessionId};

use super::Recorder;
use crate::event::LifecycleEvent;

impl Recorder {
    /// Releases `session` with its `holds`. A release the store did not commit leaves the
    /// session owned by this process: once its lease expires, a live peer
    /// releases it (or `settle recover` finalizes it).
    pub(super) async fn release(&mut self, session: SessionId, holds: Holds, at: SystemTime) {
        // Its row must be as the core left it (idle) before it is released:
        // the writes a store blip left waiting land first, within the
        // shutdown's budget.
        if !self.retries.is_empty() {
            self.settle_retries().await;
        }
        let call = self.store.release(self.owner, session, holds, at);
        let released = match self.bounded(call).await {
            Ok(()) => {
                self.report.released.push(session);
                true
            }
            Err(unwritten) => {
                self.failed(Some(session), "release a session for adoption", &unwritten);
                self.report.left_recoverable.push(session);
                false
            }
        };
        self.events
            .emit(None, || LifecycleEvent::HandedOff { session, released });
    }
}
