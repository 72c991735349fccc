use std::time::{Instant, SystemTime};

/// The driver's clock: tokio's (so tests can pause it) fed to the core as
/// `std::time::Instant`, and mapped to wall-clock time for durable records.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    origin: Instant,
    wall_origin: SystemTime,
}

impl Clock {
    pub fn new() -> Self {
        Clock {
            origin: tokio::time::Instant::now().into_std(),
            wall_origin: SystemTime::now(),
        }
    }

    /// Now, as the core wants it.
    pub fn now(&self) -> Instant {
        tokio::time::Instant::now().into_std()
    }

    /// The wall-clock time of a core instant.
    pub fn wall(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.origin) {
            Some(ahead) => self.wall_origin + ahead,
            None => self.wall_origin - self.origin.duration_since(at),
        }
    }
}

/// The instant `bound` from now on tokio's clock; a bound too long to
/// represent is as good as none (about a century).
pub(crate) fn after(bound: std::time::Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(bound)
        .unwrap_or_else(|| now + std::time::Duration::from_secs(100 * 365 * 24 * 3600))
}

/// A measured wait as a person reads it: to the millisecond ("10.002s",
/// not "10.001886575s"), for the messages that say how long was waited.
pub(crate) fn to_millis(waited: std::time::Duration) -> std::time::Duration {
    std::time::Duration::from_millis(u64::try_from(waited.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    #[test]
    fn a_measured_wait_is_said_to_the_millisecond() {
        let waited = Duration::new(10, 1_886_575);
        assert_eq!(format!("{:?}", super::to_millis(waited)), "10.001s");
        assert_eq!(
            format!("{:?}", super::to_millis(Duration::from_secs(10))),
            "10s"
        );
    }
}
