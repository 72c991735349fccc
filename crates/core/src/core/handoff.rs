//! Handing sessions off to another process and adopting them (SPEC §12).
//! Neither moves a state: a released session leaves this core as it was,
//! open and idle, and an adopted one enters it so.

use std::time::Instant;

use super::Core;
use crate::answer::Asks;
use crate::session::{Intent, Session};
use crate::{Cause, Effect, Error, HandOff, Handled, Holds, Outcome, Scope, SessionId};

/// What an adopted session brings from the process that released it.
pub(super) struct Carried {
    /// Turns it ran there.
    pub turns: u32,
    /// How its last turn ended.
    pub last_outcome: Option<Outcome>,
    /// The holds it was released with.
    pub holds: Holds,
}

impl Core {
    /// Whether `id` is to be released, not finalized, once it is idle: a
    /// handoff decided it, and the lease that makes it this process's to
    /// release still holds (G8).
    pub(super) fn hands_off(&self, id: SessionId) -> bool {
        !self.lease_lost
            && self
                .sessions
                .get(&id)
                .is_some_and(|s| s.intent == Some(Intent::HandOff))
    }

    /// Releases `id`, which the caller found idle, with no work and no
    /// child left (SPEC §12): the core lets go of its record and remembers
    /// it as another process's; its parent counts it gone, as a finalized
    /// child. It stays in its parent's list of children until that is
    /// compacted, as a forgotten child does.
    pub(super) fn hand_off(&mut self, id: SessionId) {
        let Some(mut s) = self.sessions.remove(&id) else {
            return;
        };
        self.deadlines.unindex_idle(&mut s.idle);
        if s.has_slot {
            self.slots_taken -= 1;
        }
        // What it delegated to is not interrupted: it is not finalized.
        self.delegations.remove(&id);
        self.open -= 1;
        self.owing -= usize::from(s.room_owed);
        self.handed_off.insert(id, ());
        if let Some(p) = s.parent.and_then(|p| self.sessions.get_mut(&p)) {
            p.unsettled_children -= 1;
            p.unfinalized_children -= 1;
        }
        if let Some(shutdown) = self.shutdown.as_mut() {
            shutdown.summary.released.push(id);
        }
        self.effects.push_back(Effect::HandOff(HandOff {
            session: id,
            turns: s.turns,
            last_outcome: s.last_outcome,
            holds: s.holds,
        }));
    }

    /// [`Event::Adopt`](crate::Event::Adopt).
    pub(super) fn adopt(
        &mut self,
        now: Instant,
        id: SessionId,
        parent: Option<SessionId>,
        scope: Scope,
        carried: Carried,
    ) -> Result<Handled, Error> {
        let Carried {
            turns,
            last_outcome,
            holds,
        } = carried;
        if self.sessions.contains_key(&id) || self.forgotten.contains(id) {
            return Err(Error::DuplicateSession(id));
        }
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        // Under its parent only when this core may give it one.
        let parent = parent.filter(|p| self.answer(*p, Asks::Parent).is_none());
        // No eviction for it (G12): sessions this core serves may be in
        // use, and the adopted one stays released if it is refused.
        if let Some(cap) = self.policy.lru_cap.filter(|&cap| self.open >= cap) {
            return Err(Error::NoRoomToAdopt { cap });
        }
        let mut s = Session::new(parent, now);
        s.scope = scope;
        s.turns = turns;
        s.entry_turns = turns;
        s.last_outcome = last_outcome;
        // Held where it was, held here: no automatic path takes it (G3).
        s.holds = holds;
        self.enter(now, id, s, Vec::new(), Cause::Adopted)?;
        self.handed_off.remove(&id);
        Ok(Handled::Applied)
    }

    /// Whether `id` was handed off to another process by this core (and
    /// not adopted back since).
    pub fn is_handed_off(&self, id: SessionId) -> bool {
        self.handed_off.contains_key(&id)
    }
}
