use std::time::Duration;

use settle_core::Policy;

/// Everything a runtime is tuned by, with the defaults of SPEC §3–5.
#[derive(Debug, Clone)]
pub struct Config {
    /// The core's policy: settle timeout, idle TTL, LRU cap, orphan grace.
    pub policy: Policy,
    /// How long running turns may finish once shutdown begins (G9).
    pub drain_timeout: Duration,
    /// How long a provider stream may go without an event before the turn
    /// ends with `idle_timeout`; `None` disables it. A turn's request can override it.
    pub idle_timeout: Option<Duration>,
    /// The budget for flushing every transcript at the start of a shutdown.
    pub flush_budget: Duration,
    /// How many sessions may hold an active-session slot (run turns) at once;
    /// `None` for no limit.
    pub slots: Option<usize>,
    /// How long the `on_session_end` hook may run before it is abandoned.
    pub hook_timeout: Duration,
    /// How long this process's lease on its live sessions lasts; it is renewed
    /// at a third of that. Another process recovers them only after it lapses (G8).
    pub lease_ttl: Duration,
    /// Run recovery for sessions of dead owners when the runtime starts.
    pub recover_on_start: bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::default(),
            drain_timeout: Duration::from_secs(5),
            idle_timeout: Some(Duration::from_secs(300)),
            flush_budget: Duration::from_secs(2),
            slots: None,
            hook_timeout: Duration::from_secs(5),
            lease_ttl: Duration::from_secs(30),
            recover_on_start: false,
        }
    }
}
