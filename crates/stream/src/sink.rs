//! Where a turn's work delivers the chunks it reads.

use async_trait::async_trait;
use settle_core::TurnError;

use crate::Chunk;

/// Why a [`ChunkSink`] refused a chunk; the work stops reading either way.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SinkError {
    /// Nobody may receive the chunk any more: the receiver is gone, or the
    /// work was detached and its write access revoked. The work ends
    /// cancelled.
    #[error("the chunk sink is closed: its receiver is gone or the work was detached")]
    Closed,
    /// The chunk could not be delivered (the store failed to persist it).
    /// The work ends failed with this error.
    #[error("{0}")]
    Failed(TurnError),
}

/// Receives the chunks of one turn, in order, before anything else sees
/// them (a runtime's sink persists each one: G7).
#[async_trait]
pub trait ChunkSink: Send + 'static {
    /// Called once before the provider's stream is opened: a sink that must
    /// be ready first (the turn's row written) waits here. An error ends the
    /// work without opening a stream. Ready at once by default.
    async fn begin(&mut self) -> Result<(), SinkError> {
        Ok(())
    }

    /// Delivers one chunk; may wait for room. A cancel of the work drops
    /// this call wherever it is: a sink whose write may already be on its
    /// way (a store's commit) hands the chunk on from its drop once the
    /// write is answered, if it wants its consumer to have every chunk it
    /// kept (the runtime's does).
    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError>;
}

#[async_trait]
impl ChunkSink for tokio::sync::mpsc::Sender<Chunk> {
    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError> {
        self.send(chunk).await.map_err(|_| SinkError::Closed)
    }
}

#[async_trait]
impl ChunkSink for tokio::sync::mpsc::UnboundedSender<Chunk> {
    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError> {
        self.send(chunk).map_err(|_| SinkError::Closed)
    }
}

/// A sink made of a closure, for a driver that tags chunks with its own ids.
#[derive(Debug, Clone)]
pub struct FnSink<F>(pub F);

#[async_trait]
impl<F> ChunkSink for FnSink<F>
where
    F: FnMut(Chunk) -> Result<(), SinkError> + Send + 'static,
{
    async fn chunk(&mut self, chunk: Chunk) -> Result<(), SinkError> {
        (self.0)(chunk)
    }
}
