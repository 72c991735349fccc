//! A session's holds recorded in the store as they change (SPEC §5), in
//! order with the records around them, so that a process adopting it after
//! this one crashed keeps them: a held session is reclaimable by no
//! automatic path, in any process.

use settle_core::{Handled, Holds, SessionId};

use super::Recorder;
use crate::command::Ack;
use crate::record::HoldsTold;

impl Recorder {
    /// Records `session`'s `holds`, then tells whoever asked for the change
    /// (`told`). A hold is said held only once its record is committed (a
    /// process killed right after leaves it for its adopter); one the
    /// store did not take goes back to the driver, which takes it back
    /// before its caller is told the store's error. A release is answered
    /// once its record is tried: it is in effect here either way, and a
    /// record the store did not take (said and counted) leaves the session
    /// held for an adopter only, which is the side that reclaims nothing.
    pub(super) async fn record_holds(
        &mut self,
        session: SessionId,
        holds: Holds,
        told: Option<HoldsTold>,
    ) {
        let call = self.store.record_holds(self.owner, session, holds);
        let written = self.bounded(call).await;
        if let Err(unwritten) = &written {
            self.failed(Some(session), "record a session's holds", unwritten);
        }
        let Some(HoldsTold { hold, reply }) = told else {
            return;
        };
        match (written, hold) {
            (Err(unwritten), Some(hold)) => {
                let error = unwritten.into_error("record a session's holds");
                let _ = self.acks.send(Ack::HoldUnwritten {
                    session,
                    hold,
                    reply,
                    error,
                });
            }
            _ => {
                let _ = reply.send(Ok(Handled::Applied));
            }
        }
    }
}
