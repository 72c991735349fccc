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

use crate::SessionId;

/// How many forgotten ids wait, unsorted, before they are merged into the
/// ranges: a forget costs a push, and the merge (linear in the ranges, whose
/// count is about the number of sessions still open between forgotten ones)
/// is paid once per this many. Looking up a forgotten id scans them; only a
/// handle of a finalized session asks that, and a fresh id never does.
const PENDING: usize = 1024;

/// A set of session ids: sorted, disjoint, merged inclusive ranges
/// `(first, last)`, plus the ids forgotten since the last merge.
#[derive(Debug, Clone, Default)]
pub(crate) struct Forgotten {
    ranges: Vec<(u64, u64)>,
    pending: Vec<u64>,
    /// The largest id ever forgotten: a fresh id from the store's blocks is
    /// larger, so the common question ("is this new id taken?") is one
    /// comparison.
    max: Option<u64>,
}

impl Forgotten {
    /// Whether `id` was forgotten.
    pub fn contains(&self, id: SessionId) -> bool {
        let id = id.0;
        if self.max.is_none_or(|max| id > max) {
            return false;
        }
        if self.pending.contains(&id) {
            return true;
        }
        let at = self.ranges.partition_point(|(first, _)| *first <= id);
        at > 0 && id <= self.ranges[at - 1].1
    }

    /// Remembers `id` as forgotten.
    pub fn insert(&mut self, id: SessionId) {
        self.max = Some(self.max.map_or(id.0, |max| max.max(id.0)));
        self.pending.push(id.0);
        if self.pending.len() >= PENDING {
            self.merge();
        }
    }

    /// Merges the pending ids into the ranges.
    fn merge(&mut self) {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_unstable();
        pending.dedup();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len() + pending.len());
        let mut push = |(first, last): (u64, u64)| match merged.last_mut() {
            Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
            _ => merged.push((first, last)),
        };
        let (mut ranges, mut ids) = (self.ranges.iter().peekable(), pending.iter().peekable());
        loop {
            let next = match (ranges.peek(), ids.peek()) {
                (Some(r), Some(i)) if r.0 <= **i => ranges.next().copied(),
                (_, Some(_)) => ids.next().map(|i| (*i, *i)),
                (Some(_), None) => ranges.next().copied(),
                (None, None) => break,
            };
            if let Some(range) = next {
                push(range);
            }
        }
        self.ranges = merged;
        pending.clear();
        self.pending = pending;
    }

    /// How many ranges it keeps once merged (for tests of its size).
    #[cfg(test)]
    pub fn ranges(&mut self) -> usize {
        self.merge();
        self.ranges.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_ids_in_any_order_agree_with_a_plain_set() {
        let mut f = Forgotten::default();
        let mut plain = std::collections::BTreeSet::new();
        let mut x = 7u64;
        for _ in 0..2000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let id = (x >> 33) % 3000;
            f.insert(SessionId(id));
            plain.insert(id);
        }
        for id in 0..3100 {
            assert_eq!(f.contains(SessionId(id)), plain.contains(&id), "id {id}");
        }
    }

    fn set(ids: &[u64]) -> Forgotten {
        let mut f = Forgotten::default();
        for &id in ids {
            f.insert(SessionId(id));
        }
        f
    }

    #[test]
    fn ids_in_order_keep_one_range() {
        let mut f = set(&(1..=1000).collect::<Vec<_>>());
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
        let mut f = set(&ids);
        for id in 0..25 {
            assert_eq!(f.contains(SessionId(id)), ids.contains(&id), "id {id}");
        }
        assert_eq!(f.ranges(), 3, "0..4, 7..11, 19..21");
    }

    #[test]
    fn the_largest_id_is_remembered_too() {
        let mut f = set(&[u64::MAX, u64::MAX - 1, 0]);
        assert!(f.contains(SessionId(u64::MAX - 1)) && f.contains(SessionId(u64::MAX)));
        assert!(f.contains(SessionId(0)) && !f.contains(SessionId(1)));
        assert_eq!(f.ranges(), 2);
    }
}
