//! Back-pressure: the chunk channel behind a `Turn` is bounded, so a
//! consumer that reads slowly slows its own provider stream and memory
//! stays flat. A turn streams 1,000,000 chunks as fast as its provider can
//! make them to a consumer that reads one per millisecond (on the paused
//! clock); the provider is never more than the buffer ahead of the reader,
//! and the resident memory of this process (its own test binary) does not
//! grow with the chunks. The store persists each chunk and forgets it, so
//! what is measured is the runtime's path, not a transcript's size.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream;
use settle_core::SessionId;
use settle_runtime::{Kernel, Outcome, TurnRequest};
use settle_store::{ChunkAck, ChunkReceipt, MemoryStore, SessionStore, StoreError};
use settle_stream::{
    Chunk, DropClose, Provider, ProviderStream, Request, StreamError, StreamEvent,
};

const CHUNKS: usize = 1_000_000;
const BUFFER: usize = 16;

/// Makes `CHUNKS` chunks lazily, counting how many it made.
struct Firehose {
    made: Arc<AtomicUsize>,
}

#[async_trait]
impl Provider for Firehose {
    async fn open(&self, _: &Request) -> Result<ProviderStream, StreamError> {
        let made = self.made.clone();
        let events = stream::iter(0..CHUNKS).map(move |i| {
            made.fetch_add(1, Ordering::Relaxed);
            Ok(StreamEvent::Chunk(Chunk::text(format!(
                "chunk number {i:>12}"
            ))))
        });
        Ok(Box::new(DropClose::new(events)))
    }
}

use futures_util::StreamExt;

/// Makes `count` chunks of `size` bytes each, counting how many it made.
struct Boulders {
    count: usize,
    size: usize,
    made: Arc<AtomicUsize>,
}

#[async_trait]
impl Provider for Boulders {
    async fn open(&self, _: &Request) -> Result<ProviderStream, StreamError> {
        let (made, size) = (self.made.clone(), self.size);
        let events = stream::iter(0..self.count).map(move |_| {
            made.fetch_add(1, Ordering::Relaxed);
            Ok(StreamEvent::Chunk(Chunk::text("x".repeat(size))))
        });
        Ok(Box::new(DropClose::new(events)))
    }
}

/// A store that acknowledges each chunk at once and keeps none of them.
#[derive(Clone)]
struct Forgetful {
    inner: MemoryStore,
}

#[async_trait]
impl SessionStore for Forgetful {
    async fn register_owner(
        &self,
        owner: settle_store::OwnerInfo,
        ttl: Duration,
    ) -> Result<settle_store::OwnerId, StoreError> {
        self.inner.register_owner(owner, ttl).await
    }
    async fn renew_lease(
        &self,
        owner: settle_store::OwnerId,
        ttl: Duration,
    ) -> Result<std::time::SystemTime, StoreError> {
        self.inner.renew_lease(owner, ttl).await
    }
    async fn reserve_ids(&self, count: u32) -> Result<std::ops::Range<u64>, StoreError> {
        self.inner.reserve_ids(count).await
    }
    fn append_chunk(
        &self,
        session: SessionId,
        turn: u32,
        _chunk: settle_store::NewChunk,
    ) -> ChunkReceipt {
        ChunkReceipt::ready(Ok(ChunkAck {
            session,
            turn,
            seq: 0,
        }))
    }
    async fn flush(&self) -> Result<(), StoreError> {
        self.inner.flush().await
    }
    async fn apply(
        &self,
        batch: Vec<settle_store::LifecycleWrite>,
    ) -> Vec<Result<settle_store::Applied, StoreError>> {
        self.inner.apply(batch).await
    }
    async fn recover(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<settle_store::RecoveryReport, StoreError> {
        self.inner.recover(options).await
    }
    async fn recovery_candidates(
        &self,
        options: settle_store::RecoverOptions,
    ) -> Result<Vec<settle_store::RecoveryCandidate>, StoreError> {
        self.inner.recovery_candidates(options).await
    }
    async fn list_sessions(
        &self,
        filter: settle_store::SessionFilter,
    ) -> Result<Vec<settle_store::SessionRow>, StoreError> {
        self.inner.list_sessions(filter).await
    }
    async fn last_session(
        &self,
        state: Option<settle_store::State>,
    ) -> Result<Option<SessionId>, StoreError> {
        self.inner.last_session(state).await
    }
    async fn session_detail(
        &self,
        id: SessionId,
    ) -> Result<settle_store::SessionDetail, StoreError> {
        self.inner.session_detail(id).await
    }
    async fn memories(&self, id: SessionId) -> Result<Vec<settle_store::MemoryRow>, StoreError> {
        self.inner.memories(id).await
    }
}

/// This process's resident memory, in bytes.
fn resident() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

#[tokio::test(start_paused = true)]
async fn a_slow_consumer_slows_its_provider_and_memory_stays_flat() {
    let store = Forgetful {
        inner: MemoryStore::new(),
    };
    let kernel = Kernel::builder(Arc::new(store))
        .idle_timeout(None)
        .chunk_buffer(BUFFER)
        .start()
        .await
        .unwrap();
    let agent = kernel.register("reader", None).await.unwrap();
    let made = Arc::new(AtomicUsize::new(0));
    let before = resident();
    let mut turn = agent
        .run_turn(
            Arc::new(Firehose { made: made.clone() }),
            TurnRequest::prompt("go"),
        )
        .await
        .unwrap();

    let mut read = 0;
    let mut ahead_most = 0;
    while let Some(chunk) = turn.next_chunk().await {
        assert!(chunk.is_text());
        read += 1;
        // The provider is never more than the buffer (and the one chunk
        // in the work's hands, and the one being made) ahead.
        ahead_most = ahead_most.max(made.load(Ordering::Relaxed) - read);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let end = resident();
    assert_eq!(read, CHUNKS);
    assert_eq!(turn.outcome().await, Outcome::Completed);
    assert!(
        ahead_most <= BUFFER + 2,
        "the provider ran {ahead_most} chunks ahead of the reader"
    );
    let grown = end.saturating_sub(before);
    println!(
        "resident memory before the turn: {} KiB; after 1,000,000 chunks: {} KiB; grown {} KiB",
        before / 1024,
        end / 1024,
        grown / 1024
    );
    // 1,000,000 chunks of ~48 bytes each, held, would be over 40 MiB.
    assert!(grown < 8 << 20, "resident memory grew by {grown} bytes");
    kernel.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_consumer_of_large_chunks_holds_at_most_the_buffers_bytes() {
    // 1 MiB chunks: the default 64 chunks of them would be 64 MiB waiting.
    const SIZE: usize = 1 << 20;
    let store = Forgetful {
        inner: MemoryStore::new(),
    };
    let kernel = Kernel::builder(Arc::new(store))
        .idle_timeout(None)
        .start()
        .await
        .unwrap();
    let agent = kernel.register("reader", None).await.unwrap();
    let made = Arc::new(AtomicUsize::new(0));
    let mut turn = agent
        .run_turn(
            Arc::new(Boulders {
                count: 200,
                size: SIZE,
                made: made.clone(),
            }),
            TurnRequest::prompt("go"),
        )
        .await
        .unwrap();
    // What the default buffer's bytes hold, and the chunk in the work's
    // hands and the one being made.
    let most = settle_runtime::DEFAULT_CHUNK_BUFFER_BYTES / SIZE + 2;
    let mut read = 0;
    let mut ahead_most = 0;
    loop {
        // Nobody reads for a while: the work runs as far as it may.
        tokio::time::sleep(Duration::from_millis(50)).await;
        ahead_most = ahead_most.max(made.load(Ordering::Relaxed) - read);
        match turn.next_chunk().await {
            Some(chunk) => assert_eq!(chunk.payload().len(), SIZE),
            None => break,
        }
        read += 1;
    }
    assert_eq!(read, 200);
    assert_eq!(turn.outcome().await, Outcome::Completed);
    assert!(
        ahead_most <= most,
        "the provider ran {ahead_most} chunks of 1 MiB ahead of the reader (at most {most})"
    );
    kernel.shutdown(Duration::from_secs(1)).await;
}
