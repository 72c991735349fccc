//! `Guarded<IdleTimeout<S>>` over 1,000,000 ready items against the bare
//! stream `S` (SPEC §9: target ≤ 1.10×). Ready items never touch the timer
//! or the clock, so the wrappers should cost next to nothing.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use futures_util::{Stream, StreamExt};
use settle_stream::{Chunk, Close, CloseError, Guarded, IdleTimeout, StreamError, StreamEvent};

const ITEMS: usize = 1_000_000;

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

fn chunks() -> Vec<String> {
    // Short chunks, as a model streams them: a few characters each.
    (0..ITEMS).map(|i| format!("tok{}", i % 97)).collect()
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

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let mut group = c.benchmark_group("stream");
    group.throughput(Throughput::Elements(ITEMS as u64));
    group.sample_size(20);
    group.bench_function("bare", |b| {
        b.iter_batched(
            || Ready(chunks().into_iter()),
            |s| runtime.block_on(drain(s)),
            BatchSize::LargeInput,
        )
    });
    group.bench_function("guarded_idle_timeout", |b| {
        b.iter_batched(
            || {
                Guarded::new(IdleTimeout::new(
                    Ready(chunks().into_iter()),
                    Duration::from_secs(30),
                ))
            },
            |s| runtime.block_on(drain(s)),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
