//! A session's holds recorded in the store as they change (SPEC §5), in
//! order with the records around them, so that a process adopting it after
//! this one crashed keeps them: a held session is reclaimable by no
//! automatic path, in any process. A record a store blip refused is owed,
//! and written once the store takes writes again, as a turn's end is; a
//! later change of the same session's holds supersedes it.

use settle_core::{Handled, Holds, SessionId};

use super::bounded::{note_answer, within};
use super::retry::may_heal;
use super::unwritten::Unwritten;
use super::Recorder;
use crate::backoff::Backoff;
use crate::command::Ack;
use crate::record::HoldsTold;

/// Maps keyed by session: foldhash, as everywhere on the recorder's path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// The holds records a store blip refused, newest per session, and when to
/// try them again.
#[derive(Default)]
pub(crate) struct OwedHolds {
    owed: HashMap<SessionId, Holds>,
    wait: Option<Backoff>,
    next: Option<tokio::time::Instant>,
}

impl OwedHolds {
    /// When to try again, if anything is owed.
    pub(super) fn due(&self) -> Option<tokio::time::Instant> {
        self.next
    }

    fn owe(&mut self, session: SessionId, holds: Holds) {
        self.owed.insert(session, holds);
        if self.next.is_none() {
            let wait = self.wait.get_or_insert_with(Backoff::new).next_wait();
            self.next = Some(tokio::time::Instant::now() + wait);
        }
    }
}

impl Recorder {
    /// Records `session`'s `holds`, then tells whoever asked for the change
    /// (`told`). A hold is said held only once its record is committed (a
    /// process killed right after leaves it for its adopter); one the
    /// store did not take goes back to the driver, which takes it back
    /// before its caller is told the store's error. A release is answered
    /// once its record is tried: it is in effect here either way, and a
    /// record the store did not take is owed, written once the store takes
    /// writes again.
    pub(super) async fn record_holds(
        &mut self,
        session: SessionId,
        holds: Holds,
        told: Option<HoldsTold>,
    ) {
        // This record is the session's newest: one owed before is stale.
        self.owed_holds.owed.remove(&session);
        let taken_back = matches!(&told, Some(HoldsTold { hold: Some(_), .. }));
        // A caller's store timeout counts from its call, also when the
        // record waited here behind other writes.
        let asked = told
            .as_ref()
            .map_or_else(tokio::time::Instant::now, |told| told.asked);
        let written = match taken_back {
            true => self.write_hold(session, holds, asked).await,
            false => {
                let left = self.store_timeout.saturating_sub(asked.elapsed());
                let call = self.store.record_holds(self.owner, session, holds);
                let written = within(self.bound().min(left), self.deadline.clone(), call).await;
                note_answer(&self.calls_stalled, &self.store_stalled, &written);
                written
            }
        };
        if let Err(unwritten) = &written {
            // A hold taken back is followed by the record of its taking
            // back. A release is in effect here either way: its record,
            // refused in a way that may heal, is owed and tried again (a
            // warning), not lost (an error).
            if !taken_back && may_heal(unwritten) {
                self.retrying(session, "record a session's holds", unwritten);
                self.owed_holds.owe(session, holds);
            } else {
                self.failed(Some(session), "record a session's holds", unwritten);
            }
        }
        // A caller that gave up at its store timeout was told, and took
        // its hold back itself.
        let Some((HoldsTold { hold, .. }, reply)) =
            told.and_then(|told| told.told.take().map(|reply| (told, reply)))
        else {
            return;
        };
        match (written, hold) {
            (Err(unwritten), Some(hold)) => {
                let error = unwritten.into_error("recording a session's hold");
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

    /// The record of a hold its caller waits for: tried again while the
    /// store fails in a way that may heal (a lock, a full disk), as a
    /// registration is, until the store timeout from its call (`started`), so a
    /// blip shorter than that holds; what the store said last once it is
    /// spent.
    async fn write_hold(
        &mut self,
        session: SessionId,
        holds: Holds,
        started: tokio::time::Instant,
    ) -> Result<(), Unwritten> {
        let mut backoff = Backoff::new();
        let mut said = false;
        loop {
            let left = self.store_timeout.saturating_sub(started.elapsed());
            let call = self.store.record_holds(self.owner, session, holds);
            let written = within(self.bound().min(left), self.deadline.clone(), call).await;
            note_answer(&self.calls_stalled, &self.store_stalled, &written);
            let Err(unwritten) = &written else {
                return written;
            };
            let wait = backoff.next_wait();
            let spent = started.elapsed() + wait > self.store_timeout;
            if !may_heal(unwritten) || spent || self.budget_spent() {
                // A try cut at what was left: the caller waited for all.
                return match unwritten {
                    Unwritten::TimedOut(_) => Err(Unwritten::TimedOut(crate::clock::to_millis(
                        started.elapsed(),
                    ))),
                    _ => written,
                };
            }
            if !std::mem::replace(&mut said, true) {
                self.retrying(session, "record a session's holds", unwritten);
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// Tries every owed holds record once more; what the store still
    /// refuses in a way that may heal stays owed, the next wait doubled.
    pub(super) async fn retry_holds(&mut self) {
        let owed = std::mem::take(&mut self.owed_holds.owed);
        self.owed_holds.next = None;
        let mut again = Vec::new();
        for (session, holds) in owed {
            let call = self.store.record_holds(self.owner, session, holds);
            match self.bounded(call).await {
                Ok(()) => {}
                Err(unwritten) if may_heal(&unwritten) => again.push((session, holds)),
                Err(unwritten) => {
                    self.failed(Some(session), "record a session's holds", &unwritten);
                }
            }
        }
        if again.is_empty() {
            self.owed_holds.wait = None;
        }
        for (session, holds) in again {
            self.owed_holds.owe(session, holds);
        }
    }
}
