//! The session table: every kept record, by id, inline in one hash table.
//!
//! A slab behind an index (with the last id found remembered) was tried
//! and measured slower on the core row: the index and the slab are two
//! dependent memory reads where an inline record is one, and that read,
//! not the hashing, is what a lookup costs. The hottest handlers apply the
//! answer table on their own lookup instead (`answer::admit`), so an input
//! finds its session once, and a registration looks its id up once, where
//! its record is kept (`Sessions::insert_new`).

use std::collections::hash_map::Entry;

use crate::deadlines::{IdleMark, IdleMarks};
use crate::hash::SessionMap;
use crate::session::Session;
use crate::{Scope, SessionId};

/// The core's kept session records, by id.
#[derive(Debug, Default)]
pub(crate) struct Sessions {
    records: SessionMap<Session>,
}

impl Sessions {
    /// The record of `id`.
    #[inline]
    pub fn get(&self, id: &SessionId) -> Option<&Session> {
        self.records.get(id)
    }

    /// The record of `id`, to change it.
    #[inline]
    pub fn get_mut(&mut self, id: &SessionId) -> Option<&mut Session> {
        self.records.get_mut(id)
    }

    /// Whether `id` is kept.
    #[inline]
    pub fn contains_key(&self, id: &SessionId) -> bool {
        self.records.contains_key(id)
    }

    /// Keeps the record `make` makes as the record of `id` and returns it,
    /// or `None` (making nothing) when `id` is kept already: one lookup
    /// either way, and the record is made once its slot is found.
    #[inline]
    pub fn insert_new(
        &mut self,
        id: SessionId,
        make: impl FnOnce() -> Session,
    ) -> Option<&mut Session> {
        match self.records.entry(id) {
            Entry::Vacant(slot) => Some(slot.insert(make())),
            Entry::Occupied(_) => None,
        }
    }

    /// Drops the record of `id` and returns it.
    pub fn remove(&mut self, id: &SessionId) -> Option<Session> {
        self.records.remove(id)
    }

    /// Drops the record of `id` and returns it, if `drop` says so of it (one
    /// lookup either way).
    pub fn remove_if(
        &mut self,
        id: SessionId,
        drop: impl FnOnce(&Session) -> bool,
    ) -> Option<Session> {
        match self.records.entry(id) {
            Entry::Occupied(kept) if drop(kept.get()) => Some(kept.remove()),
            _ => None,
        }
    }

    /// Every kept record with its id, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (SessionId, &Session)> {
        self.records.iter().map(|(id, s)| (*id, s))
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

    fn scope(&self, id: SessionId) -> Option<Scope> {
        self.get(&id).map(|s| s.scope)
    }

    fn owes_room(&self, id: SessionId) -> bool {
        self.get(&id).is_some_and(|s| s.room_owed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    #[test]
    fn a_record_dropped_is_gone_and_another_kept_beside_it_is_found() {
        let now = Instant::now();
        let mut sessions = Sessions::default();
        let (a, b) = (SessionId(1), SessionId(2));
        assert!(sessions.insert_new(a, || Session::new(None, now)).is_some());
        assert!(sessions.contains_key(&a));
        assert!(
            sessions
                .insert_new(a, || Session::new(Some(b), now))
                .is_none(),
            "a kept id is not kept twice"
        );
        assert_eq!(
            sessions.get(&a).map(|s| s.parent),
            Some(None),
            "the first record stays"
        );
        assert!(sessions.remove(&a).is_some());
        // `b` is kept after `a` left.
        assert!(sessions
            .insert_new(b, || Session::new(Some(a), now))
            .is_some());
        assert!(!sessions.contains_key(&a), "a dropped record is gone");
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
            assert!(sessions
                .insert_new(SessionId(id), || Session::new(None, now))
                .is_some());
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
