//! How a store is opened, how its writer batches, and how long it waits.

use std::time::Duration;

use crate::durability::Durability;

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
    close_timeout: Duration,
    pg_connect_timeout: Duration,
    pg_statement_timeout: Duration,
    pg_idle_in_transaction_timeout: Duration,
    pg_keepalive_idle: Duration,
    existing_only: bool,
    read_only: bool,
    durability: Durability,
    wal_limit: u64,
}

impl Default for StoreOptions {
    fn default() -> Self {
        StoreOptions {
            flush_interval: Duration::from_millis(5),
            batch_size: 256,
            read_connections: 4,
            busy_timeout: Duration::from_secs(5),
            connection_timeout: Duration::from_secs(30),
            close_timeout: Duration::from_secs(1),
            pg_connect_timeout: Duration::from_secs(10),
            pg_statement_timeout: Duration::from_secs(30),
            pg_idle_in_transaction_timeout: Duration::from_secs(10),
            pg_keepalive_idle: Duration::from_secs(15),
            existing_only: false,
            read_only: false,
            durability: Durability::Normal,
            wal_limit: 64 * 1024 * 1024,
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

    /// How long dropping the last clone of a [`Store`](crate::Store) waits
    /// for its threads to commit what was queued and close (default 1 s).
    ///
    /// A thread still busy after this (its database stopped answering) is
    /// left behind with a warning in the log, so that dropping a store never
    /// holds up a process's exit; what it had not committed is lost, as on a
    /// crash, and recovery finds its sessions (G8).
    pub fn close_timeout(&self) -> Duration {
        self.close_timeout
    }

    /// How long a PostgreSQL connection may take to be established (libpq's
    /// `connect_timeout`; default 10 s, at least 2 s).
    pub fn pg_connect_timeout(&self) -> Duration {
        self.pg_connect_timeout
    }

    /// The longest one PostgreSQL statement may run, waiting for locks
    /// included, before the server cancels it (`statement_timeout`; default
    /// 30 s).
    pub fn pg_statement_timeout(&self) -> Duration {
        self.pg_statement_timeout
    }

    /// The longest a PostgreSQL connection of this store may sit inside an
    /// open transaction without sending anything before the server ends its
    /// session (`idle_in_transaction_session_timeout`; default 10 s). The
    /// store's transactions send their statements back to back, so only a
    /// process that stopped mid-transaction (SIGSTOP, a frozen VM) meets
    /// it: its row locks are released, and a recovery waits at most this
    /// long for them instead of failing.
    pub fn pg_idle_in_transaction_timeout(&self) -> Duration {
        self.pg_idle_in_transaction_timeout
    }

    /// How long a PostgreSQL connection may be silent before TCP keepalive
    /// probes it (default 15 s); after three unanswered probes, a third of
    /// this apart, the connection counts as dead, and likewise when data sent
    /// stays unacknowledged that long. A server whose process is stopped
    /// while its host still answers TCP is not noticed this way: only the
    /// statement timeout bounds a statement it left running, and callers
    /// bound their own waits.
    pub fn pg_keepalive_idle(&self) -> Duration {
        self.pg_keepalive_idle
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

    /// Whether `open` refuses a database that holds no settle database yet
    /// (an empty SQLite file or one with no tables, a PostgreSQL database
    /// without the store's tables) instead of creating the schema in it
    /// (default false). For the commands that only read a store: they write
    /// nothing to a database that is not already a store.
    pub fn existing_only(&self) -> bool {
        self.existing_only
    }

    /// Set [`existing_only`](Self::existing_only).
    pub fn with_existing_only(mut self, existing_only: bool) -> Self {
        self.existing_only = existing_only;
        self
    }

    /// Whether `open` opens an existing store to read it only (default
    /// false): nothing is created, migrated or written, so that a file and
    /// a folder this process may only read (a service's database read by an
    /// operator, a copy on a read-only mount) can be read. SQLite opens the
    /// file read-only, beside a writer that has it open or, when nobody
    /// has it open and no write-ahead log is left beside it, as a file
    /// nobody changes; PostgreSQL needs only the right to read. A store of
    /// an older schema is refused (bringing it up to date writes), and
    /// every write fails with the database's refusal. Implies
    /// [`existing_only`](Self::existing_only).
    pub fn read_only(&self) -> bool {
        self.read_only
    }

    /// Set [`read_only`](Self::read_only).
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        if read_only {
            self.existing_only = true;
        }
        self
    }

    /// What a commit to an SQLite store survives once it is answered
    /// (default [`Durability::Normal`]: a killed process loses nothing, a
    /// power loss may lose the last commits). No effect on PostgreSQL.
    pub fn durability(&self) -> Durability {
        self.durability
    }

    /// Set [`durability`](Self::durability): [`Durability::Full`] syncs
    /// every commit to the disk before answering it.
    pub fn with_durability(mut self, durability: Durability) -> Self {
        self.durability = durability;
        self
    }

    /// How large an SQLite store's write-ahead log may grow before it is
    /// folded back and started over (default 64 MiB). The log is checkpointed
    /// every 100 ms without blocking the writer, but under a steady stream
    /// of commits SQLite never gets to start it over, and it grows by every
    /// page each commit writes (a hundred times the database, outside);
    /// past this size the checkpoint waits for the writer's commit in
    /// flight and starts the log over, and the writer's next commit cuts
    /// the file back to this size (not to nothing: SQLite overwrites a log
    /// faster than it appends to one). No effect on PostgreSQL.
    pub fn wal_limit(&self) -> u64 {
        self.wal_limit
    }

    /// Set [`wal_limit`](Self::wal_limit).
    pub fn with_wal_limit(mut self, bytes: u64) -> Self {
        self.wal_limit = bytes;
        self
    }

    /// Set [`close_timeout`](Self::close_timeout).
    pub fn with_close_timeout(mut self, timeout: Duration) -> Self {
        self.close_timeout = timeout;
        self
    }

    /// Set [`pg_connect_timeout`](Self::pg_connect_timeout) (rounded up to
    /// whole seconds, at least 2 s, as libpq takes it).
    pub fn with_pg_connect_timeout(mut self, timeout: Duration) -> Self {
        self.pg_connect_timeout = timeout;
        self
    }

    /// Set [`pg_statement_timeout`](Self::pg_statement_timeout) (at least
    /// 1 ms; zero would mean none).
    pub fn with_pg_statement_timeout(mut self, timeout: Duration) -> Self {
        self.pg_statement_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Set [`pg_idle_in_transaction_timeout`](Self::pg_idle_in_transaction_timeout)
    /// (at least 1 ms; zero would mean none).
    pub fn with_pg_idle_in_transaction_timeout(mut self, timeout: Duration) -> Self {
        self.pg_idle_in_transaction_timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Set [`pg_keepalive_idle`](Self::pg_keepalive_idle) (at least 3 s).
    pub fn with_pg_keepalive_idle(mut self, idle: Duration) -> Self {
        self.pg_keepalive_idle = idle.max(Duration::from_secs(3));
        self
    }

    /// `url` with this store's connection bounds as libpq parameters, each
    /// unless the URL sets it already: `connect_timeout`, TCP keepalive
    /// (`keepalives`, `keepalives_idle`, `keepalives_interval`,
    /// `keepalives_count`), `tcp_user_timeout`, and the statement and
    /// idle-in-transaction timeouts in `options` (left alone when the URL has
    /// its own `options`).
    pub(crate) fn bounded_pg_url(&self, url: &str) -> String {
        let secs = |d: Duration| d.as_secs() + u64::from(d.subsec_nanos() > 0);
        let idle = secs(self.pg_keepalive_idle);
        let interval = (idle / 3).max(1);
        let params = [
            (
                "connect_timeout",
                secs(self.pg_connect_timeout).max(2).to_string(),
            ),
            ("keepalives", "1".to_owned()),
            ("keepalives_idle", idle.to_string()),
            ("keepalives_interval", interval.to_string()),
            ("keepalives_count", "3".to_owned()),
            (
                "tcp_user_timeout",
                ((idle + 3 * interval) * 1000).to_string(),
            ),
            (
                "options",
                format!(
                    "-c%20statement_timeout%3D{}%20-c%20idle_in_transaction_session_timeout%3D{}{}",
                    self.pg_statement_timeout.as_millis().max(1),
                    self.pg_idle_in_transaction_timeout.as_millis().max(1),
                    // A reader's every transaction is read-only: the
                    // server refuses its writes.
                    if self.read_only {
                        "%20-c%20default_transaction_read_only%3Don"
                    } else {
                        ""
                    }
                ),
            ),
        ];
        let (base, query) = match url.split_once('?') {
            Some((base, query)) => (base, query),
            None => (url, ""),
        };
        let present: Vec<&str> = query
            .split('&')
            .filter_map(|pair| pair.split('=').next())
            .collect();
        let mut out = String::from(base);
        let mut sep = '?';
        if !query.is_empty() {
            out.push('?');
            out.push_str(query);
            sep = '&';
        }
        for (key, value) in params {
            if !present.contains(&key) {
                out.push(sep);
                out.push_str(key);
                out.push('=');
                out.push_str(&value);
                sep = '&';
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_added_to_a_url_but_never_override_it() {
        let options = StoreOptions::default()
            .with_pg_connect_timeout(Duration::from_millis(2500))
            .with_pg_statement_timeout(Duration::from_millis(1500))
            .with_pg_idle_in_transaction_timeout(Duration::from_millis(4000))
            .with_pg_keepalive_idle(Duration::from_secs(9));
        let url = options.bounded_pg_url("postgres://u@h/db");
        assert_eq!(
            url,
            "postgres://u@h/db?connect_timeout=3&keepalives=1&keepalives_idle=9\
             &keepalives_interval=3&keepalives_count=3&tcp_user_timeout=18000\
             &options=-c%20statement_timeout%3D1500%20-c%20idle_in_transaction_session_timeout%3D4000"
        );
        let mine =
            options.bounded_pg_url("postgres://u@h/db?connect_timeout=60&options=-c%20x%3Dy");
        assert!(
            mine.starts_with(
                "postgres://u@h/db?connect_timeout=60&options=-c%20x%3Dy&keepalives=1"
            ),
            "{mine}"
        );
        assert_eq!(mine.matches("connect_timeout").count(), 1, "{mine}");
        assert_eq!(mine.matches("options=").count(), 1, "{mine}");
    }
}
