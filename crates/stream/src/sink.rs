//! Where a turn's work delivers the chunks it reads.

use async_trait::async_trait;

/// The receiver of the chunks is gone, or the turn was detached and may no
/// longer write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the chunk sink is closed: its receiver is gone or the turn was detached")]
pub struct SinkClosed;

/// Receives the chunks of one turn, in order.
#[async_trait]
pub trait ChunkSink: Send + 'static {
    /// Delivers one chunk; may wait for room.
    async fn chunk(&mut self, text: String) -> Result<(), SinkClosed>;
}

#[async_trait]
impl ChunkSink for tokio::sync::mpsc::Sender<String> {
    async fn chunk(&mut self, text: String) -> Result<(), SinkClosed> {
        self.send(text).await.map_err(|_| SinkClosed)
    }
}

#[async_trait]
impl ChunkSink for tokio::sync::mpsc::UnboundedSender<String> {
    async fn chunk(&mut self, text: String) -> Result<(), SinkClosed> {
        self.send(text).map_err(|_| SinkClosed)
    }
}

/// A sink made of a closure, for a driver that tags chunks with its own ids.
#[derive(Debug, Clone)]
pub struct FnSink<F>(pub F);

#[async_trait]
impl<F> ChunkSink for FnSink<F>
where
    F: FnMut(String) -> Result<(), SinkClosed> + Send + 'static,
{
    async fn chunk(&mut self, text: String) -> Result<(), SinkClosed> {
        (self.0)(text)
    }
}
