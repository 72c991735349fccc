//! The stream row's workload of SPEC §9, shared by the stream crate's
//! criterion bench (`crates/stream/benches/stream.rs`) and the benchmark
//! harness (`crates/bench`), so both measure the same thing: a provider
//! stream of ready chunks, drained to its end.

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_trait::async_trait;
use futures_util::{Stream, StreamExt};
use settle_stream::{Chunk, Close, CloseError, StreamError, StreamEvent};

/// A provider stream whose items are all ready: chunks from a vector.
pub struct Ready(std::vec::IntoIter<String>);

impl Ready {
    /// `items` short chunks, as a model streams them: a few characters each.
    pub fn new(items: usize) -> Self {
        let chunks: Vec<String> = (0..items).map(|i| format!("tok{}", i % 97)).collect();
        Ready(chunks.into_iter())
    }
}

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

/// Reads `stream` to its end; the bytes of its chunks, so nothing is
/// optimized away.
pub async fn drain<S>(mut stream: S) -> usize
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
