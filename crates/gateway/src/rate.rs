//! [`Bucket`]: the requests per second one connection may send, as a
//! token bucket: it holds up to a second's worth of requests, and refills
//! at the rate. A request that finds it empty is answered `rate_limited`
//! (a notification is dropped, unanswered) and not carried out.

use std::time::Duration;

use tokio::time::Instant;

/// A token bucket of requests.
#[derive(Debug, Clone)]
pub(crate) struct Bucket {
    per_second: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `per_second` requests, refilled at that rate.
    pub fn new(per_second: u32, now: Instant) -> Self {
        let per_second = f64::from(per_second.max(1));
        Bucket {
            per_second,
            tokens: per_second,
            at: now,
        }
    }

    /// Takes one request's token; `false` when there is none.
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.at);
        self.at = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.per_second).min(self.per_second);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// How long until the next token.
    pub fn retry_after(&self) -> Duration {
        Duration::from_secs_f64(((1.0 - self.tokens) / self.per_second).max(0.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_a_second_then_the_rate() {
        let mut bucket = Bucket::new(10, Instant::now());
        for _ in 0..10 {
            assert!(bucket.take(Instant::now()));
        }
        assert!(!bucket.take(Instant::now()));
        assert!(bucket.retry_after() <= Duration::from_millis(100));
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(bucket.take(Instant::now()));
        assert!(!bucket.take(Instant::now()));
        // Idle for long, it holds a second's worth again, not more.
        tokio::time::advance(Duration::from_secs(60)).await;
        let taken = (0..100).filter(|_| bucket.take(Instant::now())).count();
        assert_eq!(taken, 10);
    }
}
