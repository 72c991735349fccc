//! The ids of the sessions the core finalized and then forgot.
//!
//! A driver forgets a session once its finalize is ordered, so that a
//! long-lived process does not keep a record per session it ever ran. Its
//! handles live on: the answer they get must still be "finalized", from the
//! core's own memory, never "not known" (the table on [`Event`](crate::Event)).
//! Ids come from the store in blocks and are finalized in roughly the order
//! they were handed out, so the set is kept as ranges: a process that ran a
//! million sessions one after another keeps one range, and the ranges are
//! never more than the gaps left by ids still open (or withdrawn, or never
//! given to this core) between them.

use std::collections::BTreeMap;

use crate::SessionId;

/// A set of session ids, as disjoint inclusive ranges `first..=last` keyed
/// by their first id. Adjacent ranges are merged on insert.
#[derive(Debug, Clone, Default)]
pub(crate) struct Forgotten {
    ranges: BTreeMap<u64, u64>,
}

impl Forgotten {
    /// Whether `id` was forgotten.
    pub fn contains(&self, id: SessionId) -> bool {
        let id = id.0;
        self.ranges
            .range(..=id)
            .next_back()
            .is_some_and(|(_, last)| id <= *last)
    }

    /// Remembers `id` as forgotten.
    pub fn insert(&mut self, id: SessionId) {
        if self.contains(id) {
            return;
        }
        let id = id.0;
        // The range ending right before `id`, if any, grows by one.
        let before = id.checked_sub(1).and_then(|prev| {
            self.ranges
                .range(..=prev)
                .next_back()
                .filter(|(_, last)| **last == prev)
                .map(|(first, _)| *first)
        });
        // The range starting right after `id`, if any, joins it.
        let after = id.checked_add(1).and_then(|next| self.ranges.remove(&next));
        self.ranges
            .insert(before.unwrap_or(id), after.unwrap_or(id));
    }

    /// How many ranges it keeps (for tests of its size).
    #[cfg(test)]
    pub fn ranges(&self) -> usize {
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[u64]) -> Forgotten {
        let mut f = Forgotten::default();
        for &id in ids {
            f.insert(SessionId(id));
        }
        f
    }

    #[test]
    fn ids_in_order_keep_one_range() {
        let f = set(&(1..=1000).collect::<Vec<_>>());
        assert_eq!(f.ranges(), 1);
        assert!(f.contains(SessionId(1)) && f.contains(SessionId(1000)));
        assert!(!f.contains(SessionId(0)) && !f.contains(SessionId(1001)));
    }

    #[test]
    fn a_gap_splits_and_filling_it_merges() {
        let mut f = set(&[1, 2, 4, 5]);
        assert_eq!(f.ranges(), 2);
        assert!(!f.contains(SessionId(3)));
        f.insert(SessionId(3));
        assert_eq!(f.ranges(), 1);
        assert!((1..=5).all(|id| f.contains(SessionId(id))));
    }

    #[test]
    fn out_of_order_and_repeated_inserts_agree_with_a_plain_set() {
        let ids = [9, 3, 7, 3, 8, 1, 2, 20, 10, 19, 0];
        let f = set(&ids);
        for id in 0..25 {
            assert_eq!(f.contains(SessionId(id)), ids.contains(&id), "id {id}");
        }
        assert_eq!(f.ranges(), 3, "0..4, 7..11, 19..21");
    }

    #[test]
    fn the_largest_id_is_remembered_too() {
        let f = set(&[u64::MAX, u64::MAX - 1, 0]);
        assert!(f.contains(SessionId(u64::MAX - 1)) && f.contains(SessionId(u64::MAX)));
        assert!(f.contains(SessionId(0)) && !f.contains(SessionId(1)));
        assert_eq!(f.ranges(), 2);
    }
}
