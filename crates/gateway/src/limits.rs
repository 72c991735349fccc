//! [`Limits`]: the bounds of each connection of a gateway, as its builder
//! sets them.

use std::time::Duration;

use crate::outbox::Bounds;

/// The bounds of each connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub queue_frames: usize,
    pub queue_bytes: usize,
    pub max_message_bytes: usize,
    pub keepalive: Option<Duration>,
}

impl Limits {
    pub fn queue(&self) -> Bounds {
        Bounds {
            frames: self.queue_frames,
            bytes: self.queue_bytes,
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
        }
    }
}
