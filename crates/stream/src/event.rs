//! What a provider stream yields, and what counts as activity for timeouts.

use crate::Chunk;

/// Whether an item is a real event or only a protocol keepalive.
///
/// [`IdleTimeout`](crate::IdleTimeout) counts only real events: a provider
/// that sends nothing but keepalives is idle.
pub trait StreamItem {
    /// True for a protocol keepalive (an SSE comment, a ping frame).
    fn is_keepalive(&self) -> bool;
}

/// One item of a provider stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamEvent {
    /// A piece of the model's output: reply text, or a structured event.
    Chunk(Chunk),
    /// Protocol activity without content; does not count as an event.
    KeepAlive,
}

impl StreamItem for StreamEvent {
    #[inline]
    fn is_keepalive(&self) -> bool {
        matches!(self, StreamEvent::KeepAlive)
    }
}
