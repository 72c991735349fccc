//! [`RetryPolicy`]: when a turn whose provider failed before its first chunk
//! is tried again, how long it waits first, and where it falls back to.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::{Provider, StreamError, StreamErrorKind};

/// How a turn retries opening its stream.
///
/// Only the opening is ever retried: a connect error, an HTTP 429 or a 5xx
/// answered before the stream exists, so before any chunk was persisted and
/// acknowledged. Once a chunk was, nothing is retried (G7: the transcript
/// keeps what was acknowledged, and the turn ends as it ends). Attempt `n`
/// (from 0) waits `initial_backoff × 2ⁿ`, at most `max_backoff`; a 429 or
/// 503 that says `Retry-After` (seconds, or an HTTP date) waits that long
/// instead, unless it is over `max_backoff`, which fails the turn with that
/// answer rather than wait past the bound. The opening and its retries
/// share the turn's first-event deadline: a wait that would end past it
/// fails the turn with the answer at once too. A cancel during the wait
/// ends the turn at once.
///
/// When the retries are spent on a retryable error, the
/// [`fallback`](Self::fallback) provider, if set, is opened once.
///
/// The default retries nothing: a framework opts in.
///
/// ```
/// use std::time::Duration;
/// use settle_stream::RetryPolicy;
///
/// let retry = RetryPolicy::default().retries(3).backoff(Duration::from_millis(200), Duration::from_secs(5));
/// assert_eq!(retry.delay(0, None), Some(Duration::from_millis(200)));
/// assert_eq!(retry.delay(2, None), Some(Duration::from_millis(800)));
/// assert_eq!(retry.delay(3, None), None); // spent
/// ```
#[derive(Clone)]
pub struct RetryPolicy {
    /// How many times an opening is tried again (0: never).
    pub max_retries: u32,
    /// The wait before the first retry.
    pub initial_backoff: Duration,
    /// The longest wait before a retry.
    pub max_backoff: Duration,
    /// Opened once when the retries are spent on a retryable error.
    pub fallback: Option<Arc<dyn Provider>>,
}

impl fmt::Debug for RetryPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RetryPolicy")
            .field("max_retries", &self.max_retries)
            .field("initial_backoff", &self.initial_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("fallback", &self.fallback.is_some())
            .finish()
    }
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 0,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(30),
            fallback: None,
        }
    }
}

impl RetryPolicy {
    /// Sets how many times an opening is tried again.
    pub fn retries(mut self, max: u32) -> Self {
        self.max_retries = max;
        self
    }

    /// Sets the first wait and the longest.
    pub fn backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max;
        self
    }

    /// Sets the provider opened once the retries are spent.
    pub fn fallback(mut self, provider: Arc<dyn Provider>) -> Self {
        self.fallback = Some(provider);
        self
    }

    /// How long to wait before retry `attempt` (from 0), given what the
    /// server asked; `None` when no retry is left or the server asked for
    /// more than [`max_backoff`](Self::max_backoff).
    pub fn delay(&self, attempt: u32, retry_after: Option<Duration>) -> Option<Duration> {
        if attempt >= self.max_retries {
            return None;
        }
        if let Some(asked) = retry_after {
            return (asked <= self.max_backoff).then_some(asked);
        }
        let factor = 1u32.checked_shl(attempt).unwrap_or(u32::MAX);
        Some(
            self.initial_backoff
                .saturating_mul(factor)
                .min(self.max_backoff),
        )
    }

    /// Whether `error`, met while opening a stream, may heal on a retry,
    /// and what the server asked to wait: a connect error, a 429, a 5xx.
    pub fn retryable(error: &StreamError) -> Option<Option<Duration>> {
        match error.kind() {
            StreamErrorKind::Connect { .. } => Some(None),
            StreamErrorKind::Status {
                status,
                retry_after,
                ..
            } if *status == 429 || (500..600).contains(status) => Some(*retry_after),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_its_bound_and_honours_retry_after_within_it() {
        let policy = RetryPolicy::default()
            .retries(10)
            .backoff(Duration::from_secs(1), Duration::from_secs(5));
        let waits: Vec<_> = (0..5).map(|n| policy.delay(n, None)).collect();
        assert_eq!(waits, [1, 2, 4, 5, 5].map(|s| Some(Duration::from_secs(s))));
        let many = policy.clone().retries(100);
        assert_eq!(many.delay(40, None), Some(Duration::from_secs(5)));
        assert_eq!(
            policy.delay(0, Some(Duration::from_secs(3))),
            Some(Duration::from_secs(3))
        );
        assert_eq!(policy.delay(0, Some(Duration::from_secs(6))), None);
        assert_eq!(policy.delay(10, None), None);
    }

    #[test]
    fn only_errors_that_may_heal_are_retryable() {
        let status = |status, retry_after| {
            StreamError::from(StreamErrorKind::Status {
                url: "u".into(),
                status,
                body: String::new(),
                retry_after,
            })
        };
        let after = Some(Duration::from_secs(2));
        assert_eq!(RetryPolicy::retryable(&status(429, after)), Some(after));
        assert_eq!(RetryPolicy::retryable(&status(503, None)), Some(None));
        assert_eq!(RetryPolicy::retryable(&status(404, None)), None);
        assert_eq!(RetryPolicy::retryable(&status(401, None)), None);
        let protocol = StreamError::from(StreamErrorKind::Protocol("x".into()));
        assert_eq!(RetryPolicy::retryable(&protocol), None);
    }
}
