use std::time::Duration;

/// The tunables of the lifecycle (SPEC §3, §5), with the defaults of the spec.
///
/// ```
/// use std::time::Duration;
/// use settle_core::Policy;
///
/// let policy = Policy::default()
///     .settle_timeout(Duration::from_millis(250))
///     .idle_ttl(None);
/// assert_eq!(policy.lru_cap, Some(1000));
/// assert_eq!(policy.idle_ttl, None);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Policy {
    /// How long cancelled work may take to unwind before it is detached (G5).
    pub settle_timeout: Duration,
    /// How long a session may sit idle before the idle reap claims it; `None` disables it.
    pub idle_ttl: Option<Duration>,
    /// How many open sessions may exist: a registration at the cap first
    /// evicts the least recently active idle session (never the new one,
    /// nor its parent), and is refused with
    /// [`Error::OverCapacity`](crate::Error::OverCapacity) when none can be
    /// evicted. `None` disables the cap.
    pub lru_cap: Option<usize>,
    /// How long a session may have no transport attached before the orphan
    /// reap claims it (only sessions that had a transport are ever orphans).
    /// With a zero grace, an orphan found busy is claimed as soon as it is idle.
    pub orphan_grace: Duration,
    /// How many sessions may hold an active-session slot at once; `None`:
    /// no limit. A session takes a slot with its first turn and gives it
    /// back when it is finalized (SPEC §4 step 5); a turn that finds every
    /// slot taken is refused with [`Error::NoSlot`](crate::Error::NoSlot).
    pub slots: Option<usize>,
}

impl Default for Policy {
    fn default() -> Self {
        Policy {
            settle_timeout: Duration::from_secs(1),
            idle_ttl: Some(Duration::from_secs(30 * 60)),
            lru_cap: Some(1000),
            orphan_grace: Duration::from_secs(60),
            slots: None,
        }
    }
}

impl Policy {
    /// Sets how long cancelled work may take to unwind before it is detached.
    #[must_use]
    pub fn settle_timeout(mut self, timeout: Duration) -> Self {
        self.settle_timeout = timeout;
        self
    }

    /// Sets the idle time-to-live; `None` disables the idle reap.
    #[must_use]
    pub fn idle_ttl(mut self, ttl: Option<Duration>) -> Self {
        self.idle_ttl = ttl;
        self
    }

    /// Sets the open-session cap; `None` disables LRU eviction.
    #[must_use]
    pub fn lru_cap(mut self, cap: Option<usize>) -> Self {
        self.lru_cap = cap;
        self
    }

    /// Sets how many sessions may hold an active-session slot; `None`: no limit.
    #[must_use]
    pub fn slots(mut self, slots: Option<usize>) -> Self {
        self.slots = slots;
        self
    }

    /// Sets how long a session may have no transport before it is an orphan.
    #[must_use]
    pub fn orphan_grace(mut self, grace: Duration) -> Self {
        self.orphan_grace = grace;
        self
    }
}
