//! The block of session ids the driver registers under: reserved from the
//! store ahead of need by the recorder, so registering never waits for the
//! store on the driver's task.

use std::ops::Range;

use crate::record::{Outbox, Record};

/// How many ids one reservation asks for.
pub(crate) const BLOCK: u32 = 1024;

#[derive(Debug)]
pub(crate) struct IdBlock {
    current: Range<u64>,
    /// The next block, once reserved.
    next: Option<Range<u64>>,
    requested: bool,
}

impl IdBlock {
    pub fn new(first: Range<u64>) -> Self {
        IdBlock {
            current: first,
            next: None,
            requested: false,
        }
    }

    /// The next id, asking the recorder for another block when this one runs
    /// low; `None` when none is left yet.
    pub fn take(&mut self, recorder: &mut Outbox) -> Option<u64> {
        if self.current.is_empty() {
            if let Some(next) = self.next.take() {
                self.current = next;
            }
        }
        let id = self.current.next();
        let low = self.current.end - self.current.start < u64::from(BLOCK / 2);
        if low && self.next.is_none() && !self.requested {
            self.requested = true;
            recorder.push(Record::ReserveIds { count: BLOCK });
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
