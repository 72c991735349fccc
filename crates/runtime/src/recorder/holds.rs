//! A session's holds recorded in the store as they change (SPEC §5), in
//! order with the records around them, so that a process adopting it after
//! this one crashed keeps them: a held session is reclaimable by no
//! automatic path, in any process.

use settle_core::{Holds, SessionId};

use super::Recorder;

impl Recorder {
    /// Records `session`'s `holds`. A write the store did not take is said
    /// and counted; the session keeps its holds here, and only a crash of
    /// this process before the next change would lose them.
    pub(super) async fn record_holds(&mut self, session: SessionId, holds: Holds) {
        let call = self.store.record_holds(self.owner, session, holds);
        if let Err(unwritten) = self.bounded(call).await {
            self.failed(Some(session), "record a session's holds", &unwritten);
        }
    }
}
