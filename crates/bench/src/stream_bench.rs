//! The stream row: `Guarded<IdleTimeout<S>>` over N ready items against the
//! bare stream `S` (the same logic as `crates/stream/benches/stream.rs`).
//! Ready items never touch the timer or the clock, so the wrappers should
//! cost next to nothing; the items themselves cost next to nothing too, which
//! makes this the harshest possible ratio for a per-item overhead.

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures_util::{Stream, StreamExt};
use settle_stream::{Chunk, Close, CloseError, Guarded, IdleTimeout, StreamError, StreamEvent};

/// A provider stream whose items are all ready: chunks from a vector.
struct Ready(std::vec::IntoIter<String>);

impl Stream for Ready {
    type Item = Result<StreamEvent, StreamError>;

    #[inline]
    fn poll_next(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        Poll::Ready(
            self.0
                .next()
                .map(|c| Ok(StreamEvent::Chunk(Chunk::text(c)))),
        )
    }
}

#[async_trait]
impl Close for Ready {
    fn close_now(&mut self) -> Result<(), CloseError> {
        Ok(())
    }
}

/// Short chunks, as a model streams them: a few characters each.
fn chunks(items: usize) -> Vec<String> {
    (0..items).map(|i| format!("tok{}", i % 97)).collect()
}

async fn drain<S>(mut stream: S) -> usize
where
    S: Stream<Item = Result<StreamEvent, StreamError>> + Unpin,
{
    let mut bytes = 0;
    while let Some(item) = stream.next().await {
        if let Ok(StreamEvent::Chunk(chunk)) = item {
            bytes += black_box(chunk).payload().len();
        }
    }
    bytes
}

/// The idle timeout the wrapped stream carries (never reached: every item is ready).
const IDLE: Duration = Duration::from_secs(30);

/// One round of ours: drain `items` chunks through the wrappers.
pub fn guarded_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream = Guarded::new(IdleTimeout::new(Ready(chunks(items).into_iter()), IDLE));
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}

/// One round of the baseline: drain the same chunks from the bare stream.
pub fn bare_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream = Ready(chunks(items).into_iter());
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}

/// Where the wrapper overhead sits: one round of `Guarded<S>` alone.
pub fn guarded_only_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream: Guarded<Ready> = Guarded::new(Ready(chunks(items).into_iter()));
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}

/// Where the wrapper overhead sits: one round of `IdleTimeout<S>` alone.
pub fn idle_only_round(rt: &tokio::runtime::Runtime, items: usize) -> Duration {
    let stream = IdleTimeout::new(Ready(chunks(items).into_iter()), IDLE);
    let start = Instant::now();
    black_box(rt.block_on(drain(stream)));
    start.elapsed()
}
