//! The block of session ids the driver registers under: reserved from the
//! store ahead of need by the recorder, so registering never waits for the
//! store on the driver's task.

use std::ops::Range;

use crate::record::{Outbox, Record};

/// How many ids the first reservation asks for.
pub(crate) const BLOCK: u32 = 1024;

/// The most ids one reservation asks for. A block grows while registrations
/// outrun it (each time some had to wait for ids, the next reservation asks
/// for twice as many), so a burst of ten thousand waits for a few
/// reservations rather than one a thousand; ids left unused when the
/// process exits are skipped, as any reserved block's are.
pub(crate) const MAX_BLOCK: u32 = 65_536;

#[derive(Debug)]
pub(crate) struct IdBlock {
    current: Range<u64>,
    /// The next block, once reserved.
    next: Option<Range<u64>>,
    requested: bool,
    /// How many ids the next reservation asks for.
    size: u32,
}

impl IdBlock {
    pub fn new(first: Range<u64>) -> Self {
        IdBlock {
            current: first,
            next: None,
            requested: false,
            size: BLOCK,
        }
    }

    /// The next id, asking the recorder for another block when this one runs
    /// low (under half a block left); `None` when none is left yet.
    pub fn take(&mut self, recorder: &mut Outbox) -> Option<u64> {
        if self.current.is_empty() {
            if let Some(next) = self.next.take() {
                self.current = next;
            }
        }
        let id = self.current.next();
        if id.is_none() {
            // A registration waits for ids: blocks this size are too small
            // for how fast they go.
            self.size = self.size.saturating_mul(2).min(MAX_BLOCK);
        }
        let low = self.current.end - self.current.start < u64::from(self.size / 2);
        if low && self.next.is_none() && !self.requested {
            self.requested = true;
            recorder.push(Record::ReserveIds { count: self.size });
        }
        id
    }

    /// A reserved block arrived.
    pub fn refill(&mut self, block: Range<u64>) {
        self.requested = false;
        if self.current.is_empty() {
            self.current = block;
        } else {
            self.next = Some(block);
        }
    }

    /// The reservation failed; the next `take` that runs dry asks again.
    pub fn failed(&mut self) {
        self.requested = false;
    }
}

#[cfg(test)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;

    /// The counts of the reservations `rx` received so far.
    fn asked(outbox: &mut Outbox, rx: &mut mpsc::UnboundedReceiver<Vec<Record>>) -> Vec<u32> {
        outbox.flush();
        let mut counts = Vec::new();
        while let Ok(records) = rx.try_recv() {
            for record in records {
                if let Record::ReserveIds { count } = record {
                    counts.push(count);
                }
            }
        }
        counts
    }

    #[test]
    fn a_block_is_asked_for_at_half_and_grows_each_time_registrations_wait_for_ids() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut outbox = Outbox::new(tx);
        let mut ids = IdBlock::new(1..1 + u64::from(BLOCK));
        let mut taken = Vec::new();
        // Half the first block goes before the next is asked for.
        for _ in 0..BLOCK / 2 {
            taken.extend(ids.take(&mut outbox));
        }
        assert_eq!(asked(&mut outbox, &mut rx), Vec::<u32>::new());
        taken.extend(ids.take(&mut outbox));
        assert_eq!(asked(&mut outbox, &mut rx), [BLOCK]);
        // Used up before the next arrives: the registration waits, and the
        // next reservation asks for twice as many.
        while let Some(id) = ids.take(&mut outbox) {
            taken.push(id);
        }
        let mut next = 1 + u64::from(BLOCK);
        ids.refill(next..next + u64::from(BLOCK));
        next += u64::from(BLOCK);
        taken.extend(ids.take(&mut outbox));
        assert_eq!(asked(&mut outbox, &mut rx), [2 * BLOCK]);
        // Arrived in time: no wait, no growth.
        ids.refill(next..next + u64::from(2 * BLOCK));
        while taken.len() < 3 * BLOCK as usize {
            taken.extend(ids.take(&mut outbox));
        }
        let asked_then = asked(&mut outbox, &mut rx);
        assert!(asked_then.iter().all(|&c| c == 2 * BLOCK), "{asked_then:?}");
        // Every id once, in order.
        assert!(taken.windows(2).all(|w| w[1] == w[0] + 1));
    }

    #[test]
    fn a_block_never_grows_past_its_bound() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let mut outbox = Outbox::new(tx);
        let mut ids = IdBlock::new(0..0);
        for start in 1..=20 {
            assert_eq!(ids.take(&mut outbox), None);
            let counts = asked(&mut outbox, &mut rx);
            assert!(counts.len() <= 1);
            let count = counts.first().copied().unwrap_or(ids.size);
            ids.refill(start..start + 1);
            assert!(ids.take(&mut outbox).is_some());
            assert!(count <= MAX_BLOCK);
            asked(&mut outbox, &mut rx);
        }
        assert_eq!(ids.size, MAX_BLOCK);
    }
}
