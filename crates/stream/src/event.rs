//! What a provider stream yields, and what counts as activity for timeouts.

use crate::{Chunk, Truncation};

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
    /// The provider said the reply is done (an OpenAI finish reason):
    /// whole (`None`: `stop`, `tool_calls`), or cut (`Some`: `length`,
    /// `content_filter`, and the stream then ends with that truncation).
    /// What may follow is what it spent (usage) and the stream's end. A
    /// turn cancelled after it, or whose stream goes quiet past the idle
    /// timeout after it (a server that never sends `[DONE]`), ends as the
    /// reply did, `completed` or `failed` (truncated), not `cancelled` or
    /// `idle_timeout`: a budget its usage report exhausts does not cut the
    /// reply that report closes.
    Finished(Option<Truncation>),
}

impl StreamItem for StreamEvent {
    #[inline]
    fn is_keepalive(&self) -> bool {
        matches!(self, StreamEvent::KeepAlive)
    }
}
