//! Handing sessions off to another process and adopting them (SPEC §12).
//! Neither moves a state: a released session leaves this core as it was,
//! open and idle, and an adopted one enters it so.

use std::time::Instant;

use super::Core;
use crate::answer::Asks;
use crate::hash::SessionMap;
use crate::session::{Intent, Session};
use crate::{Adoptee, Cause, Effect, Error, HandOff, Handled, SessionId};

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

    /// [`Event::Adopt`](crate::Event::Adopt) and
    /// [`Event::AdoptTree`](crate::Event::AdoptTree): every member, or none
    /// (G1: a tree is never split between processes).
    pub(super) fn adopt(&mut self, now: Instant, members: Vec<Adoptee>) -> Result<Handled, Error> {
        if members.is_empty() {
            return Ok(Handled::NoOp);
        }
        let members = parents_first(members);
        let mut named = SessionMap::default();
        for m in &members {
            let taken =
                self.sessions.contains_key(&m.session) || self.forgotten.contains(m.session);
            if taken || named.insert(m.session, ()).is_some() {
                return Err(Error::DuplicateSession(m.session));
            }
        }
        if self.shutdown.is_some() {
            return Err(Error::ShuttingDown);
        }
        // No eviction for them (G12): sessions this core serves may be in
        // use, and the tree stays released, whole, if it is refused.
        if let Some(cap) = self
            .policy
            .lru_cap
            .filter(|&cap| self.open.saturating_add(members.len()) > cap)
        {
            return Err(Error::NoRoomToAdopt { cap });
        }
        for m in members {
            // Under its parent only when this core may give it one: a
            // member adopted just before it always can (registered, idle,
            // not closing).
            let parent = m.parent.filter(|p| self.answer(*p, Asks::Parent).is_none());
            let make = || {
                let mut s = Session::new(parent, now);
                s.scope = m.scope;
                s.turns = m.turns;
                s.entry_turns = m.turns;
                s.last_outcome = m.last_outcome;
                // Held where it was, held here: no automatic path takes it (G3).
                s.holds = m.holds;
                s
            };
            self.enter(now, m.session, parent, make, Vec::new(), Cause::Adopted)?;
            self.handed_off.remove(&m.session);
        }
        Ok(Handled::Applied)
    }

    /// Whether `id` was handed off to another process by this core (and
    /// not adopted back since).
    pub fn is_handed_off(&self, id: SessionId) -> bool {
        self.handed_off.contains_key(&id)
    }
}

/// `members` with each one after the member that is its parent (the order
/// given kept otherwise): a child adopted before its parent would find no
/// parent here and become a root. A cycle of parents (no tree any store
/// writes) is left in the order given.
fn parents_first(members: Vec<Adoptee>) -> Vec<Adoptee> {
    let at: SessionMap<usize> = members
        .iter()
        .enumerate()
        .map(|(i, m)| (m.session, i))
        .collect();
    let depth = |mut i: usize| {
        let mut depth = 0usize;
        while let Some(&p) = members[i].parent.as_ref().and_then(|p| at.get(p)) {
            depth += 1;
            if depth > members.len() {
                return 0;
            }
            i = p;
        }
        depth
    };
    let depths: Vec<usize> = (0..members.len()).map(depth).collect();
    if depths.windows(2).all(|w| w[0] <= w[1]) {
        return members;
    }
    let mut keyed: Vec<(usize, Adoptee)> = depths.into_iter().zip(members).collect();
    keyed.sort_by_key(|&(depth, _)| depth);
    keyed.into_iter().map(|(_, m)| m).collect()
}
