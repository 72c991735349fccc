//! [`Limits`]: the bounds of a gateway and of each of its connections, as
//! its builder sets them. Their defaults are listed in `docs/gateway.md`.

use std::time::Duration;

use crate::outbox::Bounds;
use crate::read_ahead;

/// The default bound of the bytes of conversation held in memory: 1 GiB,
/// sixty-four sessions at the kernel's default `max_history_bytes`, and far
/// above what a thousand sessions of ordinary chat hold.
pub const DEFAULT_HISTORY_MEMORY: usize = 1024 * 1024 * 1024;

/// The bounds of the gateway and of each connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub queue_frames: usize,
    pub queue_bytes: usize,
    pub max_message_bytes: usize,
    pub keepalive: Option<Duration>,
    /// How long a client has to send a whole request head (and its TLS
    /// handshake), and how long a kept-alive HTTP connection may wait for
    /// its next request.
    pub header_timeout: Duration,
    /// How long a WebSocket connection attached to no session may send no
    /// request before it is closed.
    pub connection_idle: Option<Duration>,
    /// Connections open at once, upgraded or not.
    pub max_connections: usize,
    /// WebSocket connections open at once per named principal.
    pub max_connections_per_principal: usize,
    /// Live sessions per principal; `None`: only the kernel's cap.
    pub max_sessions_per_principal: Option<usize>,
    /// Requests per second per connection (in bursts of up to a second's
    /// worth); `None`: unlimited.
    pub requests_per_second: Option<u32>,
    /// Holds placed at once per principal; `None`: no bound.
    pub max_holds_per_principal: Option<usize>,
    /// Bytes of conversation every session's keeps in memory at once;
    /// `None`: no bound (see `conversation.rs`).
    pub max_history_memory: Option<usize>,
}

impl Limits {
    /// The most bytes one answer of many rows may take: half of what a
    /// connection's queue and a message may hold, so that it passes beside
    /// the notifications already queued.
    pub fn page_bytes(&self) -> usize {
        self.queue_bytes.min(self.max_message_bytes) / 2
    }

    /// The most bytes one `turn.chunk` may take; a larger chunk goes in
    /// parts (see `parts.rs`): a quarter of what a connection's queue and a
    /// message may hold.
    pub fn part_bytes(&self) -> usize {
        (self.queue_bytes.min(self.max_message_bytes) / 4).max(1024)
    }

    pub fn queue(&self) -> Bounds {
        Bounds {
            frames: self.queue_frames,
            bytes: self.queue_bytes,
        }
    }

    /// What a connection may have read while one of its requests is
    /// carried out (see `read_ahead.rs`): a few requests, and no more bytes
    /// than one message may hold.
    pub fn read_ahead(&self) -> read_ahead::Bounds {
        read_ahead::Bounds {
            requests: read_ahead::REQUESTS,
            bytes: self.max_message_bytes,
        }
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            queue_frames: 1024,
            queue_bytes: 1024 * 1024,
            max_message_bytes: 1024 * 1024,
            keepalive: Some(Duration::from_secs(30)),
            header_timeout: Duration::from_secs(10),
            connection_idle: Some(Duration::from_secs(5 * 60)),
            max_connections: 4096,
            max_connections_per_principal: 256,
            max_sessions_per_principal: None,
            requests_per_second: Some(100),
            max_holds_per_principal: None,
            max_history_memory: Some(DEFAULT_HISTORY_MEMORY),
        }
    }
}
