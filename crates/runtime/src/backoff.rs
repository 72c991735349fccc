//! The waits between tries of a store call that failed in a way that may
//! heal (a lock, a full disk, a server restarting): 50 ms, then twice as
//! long each time, up to 1 s. The recorder's retries of lifecycle writes,
//! a chunk's appends and a kernel's start all wait so.

use std::time::Duration;

/// The first wait.
const FIRST: Duration = Duration::from_millis(50);
/// The longest wait.
const LAST: Duration = Duration::from_secs(1);

/// The waits of one call's tries, in order.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    /// Waits starting from the first.
    pub(crate) fn new() -> Self {
        Backoff { next: FIRST }
    }

    /// The wait before the next try, without moving on.
    pub(crate) fn current(&self) -> Duration {
        self.next
    }

    /// Moves on: the next wait is twice this one, up to the longest.
    pub(crate) fn advance(&mut self) {
        self.next = (self.next * 2).min(LAST);
    }

    /// The wait before the next try, then moves on.
    pub(crate) fn next_wait(&mut self) -> Duration {
        let wait = self.current();
        self.advance();
        wait
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::Backoff;

    #[test]
    fn waits_double_from_fifty_milliseconds_up_to_a_second() {
        let mut backoff = Backoff::new();
        let waits: Vec<u128> = (0..7).map(|_| backoff.next_wait().as_millis()).collect();
        assert_eq!(waits, [50, 100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.next_wait(), Duration::from_secs(1));
    }
}
