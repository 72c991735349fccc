//! The session table: every kept record in a slab, found through an index
//! by id, with the last id looked up remembered.
//!
//! One input looks its session up several times (the answer table, then its
//! handler, then the transition's second half): the memo answers all but the
//! first without hashing, and the index's entries stay small (an id and a
//! slot) however large a record grows.

use std::cell::Cell;

use slab::Slab;

use crate::deadlines::{IdleMark, IdleMarks};
use crate::hash::SessionMap;
use crate::session::Session;
use crate::SessionId;

/// The core's kept session records, by id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    /// The slot of each kept id in `records`.
    index: SessionMap<usize>,
    /// The records, each beside its id.
    records: Slab<(SessionId, Session)>,
    /// The last id found and its slot; cleared when that record goes.
    last: Cell<Option<(SessionId, usize)>>,
}

impl Sessions {
    /// The slot of `id`, if it is kept.
    #[inline]
    fn slot(&self, id: SessionId) -> Option<usize> {
        if let Some((last, slot)) = self.last.get() {
            if last == id {
                return Some(slot);
            }
        }
        let slot = *self.index.get(&id)?;
        self.last.set(Some((id, slot)));
        Some(slot)
    }

    /// The record of `id`.
    #[inline]
    pub fn get(&self, id: &SessionId) -> Option<&Session> {
        let slot = self.slot(*id)?;
        self.records.get(slot).map(|(_, s)| s)
    }

    /// The record of `id`, to change it.
    #[inline]
    pub fn get_mut(&mut self, id: &SessionId) -> Option<&mut Session> {
        let slot = self.slot(*id)?;
        self.records.get_mut(slot).map(|(_, s)| s)
    }

    /// Whether `id` is kept.
    #[inline]
    pub fn contains_key(&self, id: &SessionId) -> bool {
        self.slot(*id).is_some()
    }

    /// Keeps `session` as the record of `id`, which must not be kept yet.
    pub fn insert(&mut self, id: SessionId, session: Session) {
        debug_assert!(!self.index.contains_key(&id), "session {id} kept twice");
        let slot = self.records.insert((id, session));
        self.index.insert(id, slot);
        self.last.set(Some((id, slot)));
    }

    /// Drops the record of `id` and returns it.
    pub fn remove(&mut self, id: &SessionId) -> Option<Session> {
        let slot = self.index.remove(id)?;
        if self.last.get().is_some_and(|(last, _)| last == *id) {
            self.last.set(None);
        }
        self.records.try_remove(slot).map(|(_, s)| s)
    }

    /// Every kept record with its id, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (SessionId, &Session)> {
        self.records.iter().map(|(_, (id, s))| (*id, s))
    }

    /// How many records are kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }
}

impl IdleMarks for Sessions {
    fn mark_mut(&mut self, id: SessionId) -> Option<&mut IdleMark> {
        self.get_mut(&id).map(|s| &mut s.idle)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_slot_taken_again_never_answers_for_the_id_that_left_it() {
        let now = Instant::now();
        let mut sessions = Sessions::default();
        let (a, b) = (SessionId(1), SessionId(2));
        sessions.insert(a, Session::new(None, now));
        assert!(sessions.contains_key(&a));
        assert!(sessions.remove(&a).is_some());
        // `b` takes the slot `a` left, and the memo named `a` last.
        sessions.insert(b, Session::new(Some(a), now));
        assert!(
            !sessions.contains_key(&a),
            "the memo must not outlive a's record"
        );
        assert!(sessions.remove(&a).is_none());
        assert_eq!(sessions.get(&b).and_then(|s| s.parent), Some(a));
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions.iter().map(|(id, _)| id).collect::<Vec<_>>(), [b]);
    }

    #[test]
    fn lookups_of_other_ids_between_two_of_one_agree_with_the_index() {
        let now = Instant::now();
        let mut sessions = Sessions::default();
        for id in 1..=64 {
            sessions.insert(SessionId(id), Session::new(None, now));
        }
        for id in (1..=64).step_by(3) {
            assert!(sessions.remove(&SessionId(id)).is_some());
        }
        for round in 0..3 {
            for id in 0..=65 {
                let kept = (1..=64).contains(&id) && (id - 1) % 3 != 0;
                assert_eq!(
                    sessions.contains_key(&SessionId(id)),
                    kept,
                    "id {id}, round {round}"
                );
            }
        }
    }
}
