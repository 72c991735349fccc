use std::time::Duration;

use settle_core::Policy;
use settle_stream::{RetryPolicy, TurnOptions};

/// Everything a kernel is tuned by, with the defaults of SPEC §3–5.
///
/// Build one with the setters (each returns the config, so they chain), or
/// set the same fields through [`KernelBuilder`](crate::KernelBuilder)'s setters.
///
/// ```
/// use std::time::Duration;
/// use settle_runtime::Config;
///
/// let config = Config::default()
///     .settle_timeout(Duration::from_millis(250))
///     .drain_timeout(Duration::from_secs(2));
/// assert_eq!(config.policy.settle_timeout, Duration::from_millis(250));
/// assert_eq!(config.flush_budget, Duration::from_secs(2));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Config {
    /// The core's policy: settle timeout, idle TTL, LRU cap, orphan grace.
    ///
    /// **The idle reap (30 min) and the LRU cap (1,000 open sessions) are on
    /// by default** (SPEC §5, for gateways): they finalize idle sessions a
    /// program registered itself too. Turn them off with `.idle_ttl(None)`
    /// and `.lru_cap(None)` when the program decides when its sessions end
    /// (see the crate's "What the kernel will do to your sessions on its own").
    pub policy: Policy,
    /// How long running turns may finish once shutdown begins (G9).
    pub drain_timeout: Duration,
    /// How long a provider stream may go without an event before the turn
    /// ends with `idle_timeout`; `None` disables it. Default
    /// [`DEFAULT_IDLE_TIMEOUT`](settle_stream::DEFAULT_IDLE_TIMEOUT) (30 s),
    /// the one default of every crate and the command line. A turn may set
    /// its own ([`SessionHandle::run_turn_with`](crate::SessionHandle::run_turn_with)).
    pub idle_timeout: Option<Duration>,
    /// How long a turn's stream may take to send its first event (the
    /// open, its retries and the wait for that event) before the turn ends
    /// with `idle_timeout`, for turns that do not set their own; `None`:
    /// the idle timeout (the default). For a model that thinks long before
    /// its first token, or a step that must start quickly.
    pub first_event_timeout: Option<Duration>,
    /// How opening a turn's stream is retried before its first chunk, for
    /// turns that do not set their own; default: never.
    pub retry: RetryPolicy,
    /// How many persisted chunks may wait, unread, for a turn's consumer
    /// before the turn waits for it (back-pressure: a slow reader slows its
    /// provider's stream, never grows memory). Default 64.
    pub chunk_buffer: usize,
    /// How many bytes of persisted chunks (their payloads) may wait,
    /// unread, for a turn's consumer: the same back-pressure, for a
    /// provider whose events are large. A chunk larger than this still
    /// goes, alone. Default 8 MiB.
    pub chunk_buffer_bytes: usize,
    /// How long the store may take to commit what a shutdown must write
    /// (every transcript, every finalize) once the drain and the settle
    /// timeout are over. Past it the rest is left for recovery (G8, G9).
    pub flush_budget: Duration,
    /// How long any other store call may take before it is given up as
    /// failed: a registration or turn start that cannot commit in time fails
    /// with a clear error instead of hanging, at this bound counted from
    /// the call (also while the store is stalled behind other writes). A chunk the store fails to
    /// take in a way that may heal (a lock, a full disk, a server
    /// restarting) is appended again until it is taken, within this bound
    /// counted from its first try; past it the turn fails with the store's
    /// cause. A turn's end the store has not taken within this bound is told
    /// to the turn's reader all the same (an agent loop is not held for a
    /// whole outage); it is written once the store takes it, and a crash
    /// before that leaves the turn to recovery (`interrupted`, G8).
    pub store_timeout: Duration,
    /// How many sessions may hold an active-session slot (run turns) at once;
    /// `None` for no limit.
    pub slots: Option<usize>,
    /// How long the `on_session_end` hook may run before it is abandoned.
    pub hook_timeout: Duration,
    /// How many `on_session_end` hooks may run at once.
    pub hook_concurrency: usize,
    /// How long this process's lease on its live sessions lasts; it is
    /// renewed every tenth of that (a failed renewal tried again after a
    /// thirtieth), so a store outage of 26 s of a 30 s lease is ridden out
    /// wherever it falls, and one of the whole of it stops the kernel.
    /// Another process recovers them only after it lapses (G8).
    pub lease_ttl: Duration,
    /// Run recovery for sessions of dead owners when the kernel starts.
    pub recover_on_start: bool,
    /// Where clients reach this process (a gateway's URL), stored with its
    /// lease for the other processes of a fleet (SPEC §12).
    pub advertise: Option<String>,
    /// The largest one message of a turn's request may be, in bytes (its
    /// content, and its tool calls as JSON); a turn with a larger one is
    /// refused with [`RuntimeError::TooLarge`](crate::RuntimeError::TooLarge)
    /// before anything is sent or written. The model's replies sent back
    /// with the history (`assistant` messages) are not held to it: they are
    /// bounded as they stream (`max_turn_bytes`) and counted in
    /// `max_history_bytes`. `None` for no limit. Default 1 MiB, the
    /// gateway's frame limit.
    pub max_prompt_bytes: Option<usize>,
    /// The largest a turn's whole request may be, in bytes (every message,
    /// counted as for `max_prompt_bytes`): a conversation that outgrows it
    /// is refused the same way, before anything is sent or written. `None`
    /// for no limit. Default 16 MiB, far above any model's context window.
    pub max_history_bytes: Option<usize>,
    /// The most chunks one turn may stream: the chunk past it is neither
    /// stored nor yielded, and the turn ends `failed` with a `too_large`
    /// error (stored with the turn). `None` (the default) for no limit.
    pub max_turn_chunks: Option<usize>,
    /// The most bytes of chunk payloads one turn may stream (a text
    /// chunk's text, another's JSON), bounded as `max_turn_chunks` is.
    /// `None` (the default) for no limit.
    pub max_turn_bytes: Option<usize>,
}

/// The default of [`Config::chunk_buffer`].
pub const DEFAULT_CHUNK_BUFFER: usize = 64;

/// The default of [`Config::chunk_buffer_bytes`]: 8 MiB, two of the largest
/// events an SSE provider stream takes.
pub const DEFAULT_CHUNK_BUFFER_BYTES: usize = 8 << 20;

/// The default of [`Config::max_prompt_bytes`]: 1 MiB.
pub const DEFAULT_MAX_PROMPT_BYTES: usize = 1 << 20;

/// The default of [`Config::max_history_bytes`]: 16 MiB.
pub const DEFAULT_MAX_HISTORY_BYTES: usize = 16 << 20;

impl Default for Config {
    fn default() -> Self {
        Config {
            policy: Policy::default(),
            drain_timeout: Duration::from_secs(5),
            idle_timeout: Some(settle_stream::DEFAULT_IDLE_TIMEOUT),
            first_event_timeout: None,
            retry: RetryPolicy::default(),
            chunk_buffer: DEFAULT_CHUNK_BUFFER,
            chunk_buffer_bytes: DEFAULT_CHUNK_BUFFER_BYTES,
            flush_budget: Duration::from_secs(2),
            store_timeout: Duration::from_secs(10),
            slots: None,
            hook_timeout: Duration::from_secs(5),
            hook_concurrency: 64,
            lease_ttl: Duration::from_secs(30),
            recover_on_start: false,
            advertise: None,
            max_prompt_bytes: Some(DEFAULT_MAX_PROMPT_BYTES),
            max_history_bytes: Some(DEFAULT_MAX_HISTORY_BYTES),
            max_turn_chunks: None,
            max_turn_bytes: None,
        }
    }
}

/// Hands `$apply` the settings (after `$args`), each with its doc, its type
/// and the field of [`Config`] it sets: the one list that both the config's
/// setters (here) and the [`KernelBuilder`](crate::KernelBuilder)'s are made
/// from.
macro_rules! settings {
    ($apply:ident!($($args:tt)*)) => {
        $apply! { ($($args)*)
            /// How long cancelled work may take to unwind before it is detached (G5).
            settle_timeout: Duration => policy.settle_timeout;
            /// How long an idle session lives before the idle reap claims it; `None` disables it.
            idle_ttl: Option<Duration> => policy.idle_ttl;
            /// How many open sessions before the least recently active idle one is evicted.
            lru_cap: Option<usize> => policy.lru_cap;
            /// How long a session may have lost its transport before the orphan reap.
            orphan_grace: Duration => policy.orphan_grace;
            /// How long running turns may finish once shutdown begins (G9).
            drain_timeout: Duration => drain_timeout;
            /// How long a provider stream may be silent before its turn times out.
            idle_timeout: Option<Duration> => idle_timeout;
            /// How long a turn's stream may take to send its first event; `None`: the idle timeout.
            first_event_timeout: Option<Duration> => first_event_timeout;
            /// How a turn's opening is retried before its first chunk.
            retry: settle_stream::RetryPolicy => retry;
            /// How many persisted chunks may wait for a turn's consumer.
            chunk_buffer: usize => chunk_buffer;
            /// How many bytes of persisted chunks may wait for a turn's consumer.
            chunk_buffer_bytes: usize => chunk_buffer_bytes;
            /// The store's budget at shutdown, after the drain and the settle timeout.
            flush_budget: Duration => flush_budget;
            /// The bound of every other store call.
            store_timeout: Duration => store_timeout;
            /// How many sessions may run turns at once.
            slots: Option<usize> => slots;
            /// How long the `on_session_end` hook may run.
            hook_timeout: Duration => hook_timeout;
            /// How many `on_session_end` hooks may run at once.
            hook_concurrency: usize => hook_concurrency;
            /// How long this process's lease lasts (renewed every tenth of it).
            lease_ttl: Duration => lease_ttl;
            /// Recover the sessions of dead owners when the kernel starts.
            recover_on_start: bool => recover_on_start;
            /// Where clients reach this process, stored with its lease (SPEC §12).
            advertise: Option<String> => advertise;
            /// The largest one message of a turn may be, in bytes; `None` for no limit.
            max_prompt_bytes: Option<usize> => max_prompt_bytes;
            /// The largest a turn's whole request may be, in bytes; `None` for no limit.
            max_history_bytes: Option<usize> => max_history_bytes;
            /// The most chunks one turn may stream; `None` for no limit.
            max_turn_chunks: Option<usize> => max_turn_chunks;
            /// The most bytes of chunks one turn may stream; `None` for no limit.
            max_turn_bytes: Option<usize> => max_turn_bytes;
        }
    };
}
pub(crate) use settings;

/// A setter on `$target` of every setting: on [`Config`] itself (`[]`), or
/// on a builder through its field (`[config]`).
macro_rules! setters {
    (@set $this:ident [$($via:ident)*] $($field:ident).+ = $value:ident) => {
        $this $(.$via)* $(.$field)+ = $value;
    };
    (($target:ty, $via:tt) $( $(#[$doc:meta])* $name:ident: $ty:ty => $($field:ident).+ ;)*) => {
        impl $target {
            $(
                $(#[$doc])*
                #[must_use]
                pub fn $name(mut self, value: $ty) -> Self {
                    setters!(@set self $via $($field).+ = value);
                    self
                }
            )*
        }
    };
}
pub(crate) use setters;

settings!(setters!(Config, []));

impl Config {
    /// The options of a turn that does not set its own.
    pub fn turn_options(&self) -> TurnOptions {
        TurnOptions {
            idle_timeout: self.idle_timeout.unwrap_or(Duration::ZERO),
            first_event_timeout: self.first_event_timeout,
            retry: self.retry.clone(),
            max_chunks: self.max_turn_chunks,
            max_bytes: self.max_turn_bytes,
        }
    }

    /// The longest a shutdown takes once begun with `drain`, whatever the
    /// store and the works do: the drain, the settle timeout, the flush budget.
    pub fn shutdown_bound(&self, drain: Duration) -> Duration {
        drain
            .saturating_add(self.policy.settle_timeout)
            .saturating_add(self.flush_budget)
    }
}
