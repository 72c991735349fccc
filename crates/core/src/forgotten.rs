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
//! given to this core) between them. The most recent ids are a bitmap, so
//! a forget costs setting one bit.

use crate::SessionId;

/// How many forgotten ids below the window wait, unsorted, before they are
/// merged into the ranges (see [`Forgotten::merge`]): only a session that
/// stayed open while far later ones came and went lands there.
const PENDING: usize = 1024;

/// The window of recent ids, in 64-bit words: 65,536 ids, 8 KiB.
const WINDOW_WORDS: usize = 1024;
/// The ids the window spans.
const SPAN: u64 = WINDOW_WORDS as u64 * 64;

/// A set of session ids: a bitmap of the most recent ids (a forget sets a
/// bit), and below it sorted, disjoint, merged inclusive ranges
/// `(first, last)`, into which the bitmap's lower half is folded whenever a
/// new id lies past its end.
#[derive(Debug, Clone, Default)]
pub(crate) struct Forgotten {
    /// Every forgotten id below `base`, merged.
    ranges: Vec<(u64, u64)>,
    /// Forgotten ids below `base` not merged into `ranges` yet.
    pending: Vec<u64>,
    /// The first id of the window (a multiple of 64).
    base: u64,
    /// Bit `i` of word `w` says whether `base + 64 w + i` was forgotten;
    /// empty until the first insert.
    window: Vec<u64>,
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
        if id >= self.base {
            // Every id up to `max` lies within the window.
            let at = id - self.base;
            let word = self.window.get((at / 64) as usize).copied().unwrap_or(0);
            return word & (1 << (at % 64)) != 0;
        }
        if self.pending.contains(&id) {
            return true;
        }
        let at = self.ranges.partition_point(|(first, _)| *first <= id);
        at > 0 && id <= self.ranges[at - 1].1
    }

    /// Remembers `id` as forgotten.
    pub fn insert(&mut self, id: SessionId) {
        let id = id.0;
        self.max = Some(self.max.map_or(id, |max| max.max(id)));
        if id < self.base {
            self.pending.push(id);
            if self.pending.len() >= PENDING {
                self.merge();
            }
            return;
        }
        if self.window.is_empty() {
            self.window = vec![0; WINDOW_WORDS];
        }
        if id - self.base >= SPAN {
            self.slide(id.saturating_sub(SPAN / 2) & !63);
        }
        let at = id - self.base;
        if let Some(word) = self.window.get_mut((at / 64) as usize) {
            *word |= 1 << (at % 64);
        }
    }

    /// Moves the window up to start at `base` (a multiple of 64, above the
    /// current one), folding the ids it leaves behind into the ranges: they
    /// are all above every range, so they are appended in order.
    fn slide(&mut self, base: u64) {
        let shift = ((base - self.base) / 64).min(WINDOW_WORDS as u64) as usize;
        fold(self.base, &self.window[..shift], &mut self.ranges);
        self.window.copy_within(shift.., 0);
        let kept = WINDOW_WORDS - shift;
        self.window[kept..].fill(0);
        self.base = base;
    }

    /// Merges the pending ids into the ranges.
    fn merge(&mut self) {
        let mut pending = std::mem::take(&mut self.pending);
        pending.sort_unstable();
        pending.dedup();
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(self.ranges.len() + pending.len());
        let (mut ranges, mut ids) = (self.ranges.iter().peekable(), pending.iter().peekable());
        loop {
            let next = match (ranges.peek(), ids.peek()) {
                (Some(r), Some(i)) if r.0 <= **i => ranges.next().copied(),
                (_, Some(_)) => ids.next().map(|i| (*i, *i)),
                (Some(_), None) => ranges.next().copied(),
                (None, None) => break,
            };
            if let Some(range) = next {
                append(&mut merged, range);
            }
        }
        self.ranges = merged;
        pending.clear();
        self.pending = pending;
    }

    /// How many ranges it keeps once everything is folded and merged (for
    /// tests of its size).
    #[cfg(test)]
    pub fn ranges(&mut self) -> usize {
        self.merge();
        let mut ranges = self.ranges.clone();
        fold(self.base, &self.window, &mut ranges);
        ranges.len()
    }
}

/// Appends the runs of set bits of `words` (bit `i` of word `w` standing
/// for id `base + 64 w + i`) to `ranges`, all of whose ranges lie below.
fn fold(base: u64, words: &[u64], ranges: &mut Vec<(u64, u64)>) {
    for (w, word) in words.iter().enumerate() {
        let mut bits = *word;
        if bits == 0 {
            continue;
        }
        let first = base + 64 * w as u64;
        while bits != 0 {
            let start = bits.trailing_zeros();
            let run = (!(bits >> start)).trailing_zeros();
            let last = start + run - 1;
            append(ranges, (first + u64::from(start), first + u64::from(last)));
            bits = if last == 63 {
                0
            } else {
                bits & (!0 << (last + 1))
            };
        }
    }
}

/// Appends `(first, last)` to sorted `ranges` whose last range starts at or
/// before `first`, merging it with that range when they touch.
fn append(ranges: &mut Vec<(u64, u64)>, (first, last): (u64, u64)) {
    match ranges.last_mut() {
        Some(prev) if first <= prev.1.saturating_add(1) => prev.1 = prev.1.max(last),
        _ => ranges.push((first, last)),
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

    #[test]
    fn ids_forgotten_roughly_in_order_across_many_windows_agree_with_a_plain_set() {
        let mut f = Forgotten::default();
        let mut plain = std::collections::BTreeSet::new();
        let mut x = 11u64;
        let mut next = || {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            x >> 33
        };
        for i in 0..400_000u64 {
            // Mostly recent ids with jitter, some long-lived stragglers far
            // below the window, and now and then a jump ahead.
            let id = match next() % 100 {
                0 => next() % (i + 1),
                1 => i * 3 + 200_000,
                _ => i + next() % 2_000,
            };
            f.insert(SessionId(id));
            plain.insert(id);
        }
        for id in (0..1_500_000).step_by(7) {
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
