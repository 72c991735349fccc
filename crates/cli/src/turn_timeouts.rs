//! `--idle-timeout` and `--first-event-timeout` of `settle chat` and
//! `settle serve`: how long a model server may be silent before its turn
//! ends `idle_timeout` (the runtime's `idle_timeout` and
//! `first_event_timeout`), the two settings a timed-out turn's error tells
//! its reader to raise.

use std::time::Duration;

use clap::Args;
use settle_runtime::KernelBuilder;

/// How long a model server may be silent.
#[derive(Debug, Clone, Args)]
pub struct TurnTimeoutArgs {
    /// How long the model server may be silent mid-reply before the turn times out (default 30s, as everywhere).
    #[arg(long, allow_hyphen_values = true, value_parser = crate::duration::parse_nonzero)]
    idle_timeout: Option<Duration>,
    /// How long the model server may take to send a reply's first event, its request included, before the turn times out (default: the idle timeout), for a model that thinks long before it answers.
    #[arg(long, allow_hyphen_values = true, value_parser = crate::duration::parse_nonzero)]
    first_event_timeout: Option<Duration>,
}

impl TurnTimeoutArgs {
    /// `builder` with these timeouts.
    pub fn apply(&self, builder: KernelBuilder) -> KernelBuilder {
        builder
            .idle_timeout(Some(
                self.idle_timeout
                    .unwrap_or(settle_stream::DEFAULT_IDLE_TIMEOUT),
            ))
            .first_event_timeout(self.first_event_timeout)
    }
}
