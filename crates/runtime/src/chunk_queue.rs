//! The queue of a turn's persisted chunks on their way to its reader,
//! bounded both in chunks and in bytes: a reader that reads slowly slows
//! its own turn (the work waits to hand a chunk on, so it stops reading the
//! provider's stream and TCP pushes back), and what waits for it stays
//! within [`Config::chunk_buffer`](crate::Config::chunk_buffer) chunks and
//! [`Config::chunk_buffer_bytes`](crate::Config::chunk_buffer_bytes) bytes
//! of payload, however large a provider's events are.

use std::sync::Arc;
use std::task::{Context, Poll};

use settle_stream::Chunk;
use tokio::sync::{mpsc, Semaphore};
use tokio_util::sync::CancellationToken;

/// A queue of at most `chunks` chunks and `bytes` bytes of payload. A chunk
/// larger than `bytes` still goes, alone.
pub(crate) fn chunk_queue(chunks: usize, bytes: usize) -> (ChunkSender, ChunkReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let slots = Arc::new(Semaphore::new(chunks.clamp(1, Semaphore::MAX_PERMITS)));
    let most = bytes.clamp(1, Semaphore::MAX_PERMITS);
    let room = Arc::new(Semaphore::new(most));
    let most = u32::try_from(most).unwrap_or(u32::MAX);
    (
        ChunkSender {
            tx,
            slots: slots.clone(),
            room: room.clone(),
            most,
        },
        ChunkReceiver {
            rx,
            slots,
            room,
            most,
        },
    )
}

/// What a chunk takes of the room: its payload's bytes, at most all of it.
fn weight(chunk: &Chunk, most: u32) -> u32 {
    u32::try_from(chunk.payload().len()).map_or(most, |len| len.min(most))
}

/// The reader went away (or closed the queue): nobody takes chunks.
#[derive(Debug)]
pub(crate) struct Gone;

/// The work's end of the queue (a clone hands on a chunk whose write was
/// still on its way when the turn was cancelled; the reader's stream ends
/// once every one is gone).
#[derive(Debug, Clone)]
pub(crate) struct ChunkSender {
    tx: mpsc::UnboundedSender<Chunk>,
    slots: Arc<Semaphore>,
    room: Arc<Semaphore>,
    most: u32,
}

impl ChunkSender {
    /// Hands `chunk` on once there is room for it (a chunk's place and its
    /// bytes), or at once, past the bounds, once `cut` is cancelled: the
    /// chunk a cancelled turn stored last is not held back by a reader that
    /// reads no more (the turn ends, and the queue with it). Cancel-safe:
    /// dropped while it waits, it took nothing.
    pub async fn send(&self, chunk: Chunk, cut: &CancellationToken) -> Result<(), Gone> {
        let weight = weight(&chunk, self.most);
        let room = async {
            let slot = self.slots.acquire().await?;
            let bytes = self.room.acquire_many(weight).await?;
            // Given back by the reader as it takes the chunk.
            slot.forget();
            bytes.forget();
            Ok::<(), tokio::sync::AcquireError>(())
        };
        tokio::select! {
            biased;
            taken = room => taken.map_err(|_| Gone)?,
            () = cut.cancelled() => {}
        }
        self.send_now(chunk)
    }

    /// Hands `chunk` on at once, past the bounds: the last chunk of a
    /// cancelled turn, which no more follow.
    pub fn send_now(&self, chunk: Chunk) -> Result<(), Gone> {
        self.tx.send(chunk).map_err(|_| Gone)
    }
}

/// The reader's end of the queue. Dropped, it lets the work's waits end.
#[derive(Debug)]
pub(crate) struct ChunkReceiver {
    rx: mpsc::UnboundedReceiver<Chunk>,
    slots: Arc<Semaphore>,
    room: Arc<Semaphore>,
    most: u32,
}

impl ChunkReceiver {
    /// The next chunk; `None` once the work dropped its end.
    pub async fn recv(&mut self) -> Option<Chunk> {
        let chunk = self.rx.recv().await;
        self.took(chunk.as_ref());
        chunk
    }

    /// The next chunk if one waits.
    pub fn try_recv(&mut self) -> Result<Chunk, mpsc::error::TryRecvError> {
        let chunk = self.rx.try_recv();
        self.took(chunk.as_ref().ok());
        chunk
    }

    /// Polls for the next chunk.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<Chunk>> {
        let polled = self.rx.poll_recv(cx);
        if let Poll::Ready(chunk) = &polled {
            self.took(chunk.as_ref());
        }
        polled
    }

    /// Takes no more chunks: the work's hand-offs fail from now on, so it
    /// never waits for this reader. Those already queued can still be read.
    pub fn close(&mut self) {
        self.rx.close();
        self.slots.close();
        self.room.close();
    }

    fn took(&self, chunk: Option<&Chunk>) {
        if let Some(chunk) = chunk {
            self.slots.add_permits(1);
            self.room.add_permits(weight(chunk, self.most) as usize);
        }
    }
}

impl Drop for ChunkReceiver {
    fn drop(&mut self) {
        self.slots.close();
        self.room.close();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Sends with a cut that never comes.
    async fn send(tx: &ChunkSender, chunk: Chunk) -> Result<(), Gone> {
        tx.send(chunk, &CancellationToken::new()).await
    }

    /// A cancelled turn's last chunk goes past both bounds at once, and is
    /// read after the ones before it.
    #[tokio::test]
    async fn a_cut_turn_hands_its_last_chunk_on_past_the_bounds() {
        let (tx, mut rx) = chunk_queue(1, 4);
        send(&tx, Chunk::text("full")).await.unwrap();
        let cut = CancellationToken::new();
        let last = tx.send(Chunk::text("last"), &cut);
        tokio::pin!(last);
        assert!(futures_util::poll!(last.as_mut()).is_pending());
        cut.cancel();
        last.await.unwrap();
        assert_eq!(rx.recv().await.unwrap().payload(), "full");
        assert_eq!(rx.recv().await.unwrap().payload(), "last");
    }

    #[tokio::test]
    async fn a_queue_holds_at_most_its_bytes_and_a_larger_chunk_alone() {
        let (tx, mut rx) = chunk_queue(64, 10);
        send(&tx, Chunk::text("12345")).await.unwrap();
        send(&tx, Chunk::text("678")).await.unwrap();
        // 8 of 10 bytes wait: a chunk of 3 does not fit, one of 2 does.
        let three = send(&tx, Chunk::text("abc"));
        tokio::pin!(three);
        assert!(futures_util::poll!(three.as_mut()).is_pending());
        assert_eq!(rx.recv().await.unwrap().payload(), "12345");
        three.await.unwrap();
        // Larger than the whole room: it waits until the queue is empty.
        let big = send(&tx, Chunk::text("x".repeat(100)));
        tokio::pin!(big);
        assert!(futures_util::poll!(big.as_mut()).is_pending());
        assert_eq!(rx.recv().await.unwrap().payload(), "678");
        assert!(futures_util::poll!(big.as_mut()).is_pending());
        assert_eq!(rx.try_recv().unwrap().payload(), "abc");
        big.await.unwrap();
        assert_eq!(rx.recv().await.unwrap().payload().len(), 100);
    }

    #[tokio::test]
    async fn a_reader_that_closes_or_goes_ends_the_works_wait() {
        let (tx, mut rx) = chunk_queue(64, 4);
        send(&tx, Chunk::text("full")).await.unwrap();
        let waiting = send(&tx, Chunk::text("more"));
        tokio::pin!(waiting);
        assert!(futures_util::poll!(waiting.as_mut()).is_pending());
        rx.close();
        assert!(waiting.await.is_err());
        // What was queued is still read.
        assert_eq!(rx.recv().await.unwrap().payload(), "full");

        let (tx, rx) = chunk_queue(64, 4);
        send(&tx, Chunk::text("full")).await.unwrap();
        drop(rx);
        assert!(send(&tx, Chunk::text("more")).await.is_err());
    }
}
