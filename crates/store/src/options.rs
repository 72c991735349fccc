//! How a store is opened and how its writer batches.

use std::time::Duration;

/// Tuning for [`Store::open_with`](crate::Store::open_with).
///
/// ```
/// use std::time::Duration;
/// use settle_store::StoreOptions;
///
/// let options = StoreOptions::default()
///     .with_flush_interval(Duration::from_millis(2))
///     .with_batch_size(128);
/// assert_eq!(options.batch_size(), 128);
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct StoreOptions {
    flush_interval: Duration,
    batch_size: usize,
    read_connections: u32,
    busy_timeout: Duration,
    connection_timeout: Duration,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            flush_interval: Duration::from_millis(5),
            batch_size: 256,
            read_connections: 4,
            busy_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(30),
        }
    }
}

impl StoreOptions {
    /// The longest the writer keeps gathering chunks into one transaction
    /// (default 5 ms).
    ///
    /// The writer takes every chunk already waiting, up to
    /// [`batch_size`](Self::batch_size), and commits them in one transaction;
    /// chunks that arrive while it commits form the next batch. It never waits
    /// for more chunks when none is waiting, so a lone chunk is committed at
    /// once, and it closes a batch after this interval even if chunks keep
    /// arriving. A chunk is therefore acknowledged at most this interval plus
    /// one commit after it was appended.
    pub fn flush_interval(&self) -> Duration {
        self.flush_interval
    }

    /// The most chunks committed in one transaction (default 256).
    pub fn batch_size(&self) -> usize {
        self.batch_size
    }

    /// How many pooled connections serve reads (default 4).
    pub fn read_connections(&self) -> u32 {
        self.read_connections
    }

    /// How long an SQLite connection waits for another process's lock before
    /// failing (default 5 s).
    pub fn busy_timeout(&self) -> Duration {
        self.busy_timeout
    }

    /// How long a read waits for a free pooled connection (default 30 s).
    pub fn connection_timeout(&self) -> Duration {
        self.connection_timeout
    }

    /// Set [`flush_interval`](Self::flush_interval).
    pub fn with_flush_interval(mut self, interval: Duration) -> Self {
        self.flush_interval = interval;
        self
    }

    /// Set [`batch_size`](Self::batch_size) (at least 1).
    pub fn with_batch_size(mut self, size: usize) -> Self {
        self.batch_size = size.max(1);
        self
    }

    /// Set [`read_connections`](Self::read_connections) (at least 1).
    pub fn with_read_connections(mut self, n: u32) -> Self {
        self.read_connections = n.max(1);
        self
    }

    /// Set [`busy_timeout`](Self::busy_timeout).
    pub fn with_busy_timeout(mut self, timeout: Duration) -> Self {
        self.busy_timeout = timeout;
        self
    }

    /// Set [`connection_timeout`](Self::connection_timeout).
    pub fn with_connection_timeout(mut self, timeout: Duration) -> Self {
        self.connection_timeout = timeout;
        self
    }
}
