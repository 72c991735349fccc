//! A provider stream that records what happens to it, for the G4/G5/G6 tests.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{FutureExt, Stream};
use settle_stream::{Chunk, Close, CloseError, StreamError, StreamErrorKind, StreamEvent};
use tokio::time::Sleep;

/// A shared, ordered event log.
#[derive(Clone, Default)]
pub struct Log(Arc<Mutex<Vec<String>>>);

impl Log {
    pub fn push(&self, entry: impl Into<String>) {
        self.0.lock().unwrap().push(entry.into());
    }

    pub fn entries(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    pub fn count(&self, entry: &str) -> usize {
        self.entries().iter().filter(|e| *e == entry).count()
    }

    /// How many hold this log: the test and each recorded stream not yet
    /// dropped.
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Index of the first occurrence of `entry`; panics if missing.
    pub fn pos(&self, entry: &str) -> usize {
        let entries = self.entries();
        entries
            .iter()
            .position(|e| e == entry)
            .unwrap_or_else(|| panic!("`{entry}` not in {entries:?}"))
    }
}

/// One step of a recorded stream's script.
#[derive(Clone, Debug)]
pub enum Step {
    Chunk(&'static str),
    KeepAlive,
    Wait(Duration),
    Fail,
    Hang,
}

/// How a recorded stream closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseKind {
    /// `close_now` works.
    Sync,
    /// Only `close().await` works; it takes this long.
    AsyncOnly(Duration),
    /// The close panics.
    Panics,
    /// The async close fails (the provider says it could not close); the
    /// sync close works.
    AsyncFails,
}

pub struct Recording {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<Sleep>>>,
    close: CloseKind,
    log: Log,
}

impl Recording {
    pub fn new(log: &Log, steps: impl IntoIterator<Item = Step>) -> Self {
        Recording {
            steps: steps.into_iter().collect(),
            sleep: None,
            close: CloseKind::Sync,
            log: log.clone(),
        }
    }

    pub fn close_kind(mut self, close: CloseKind) -> Self {
        self.close = close;
        self
    }
}

impl Stream for Recording {
    type Item = Result<StreamEvent, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            let Some(step) = this.steps.front().cloned() else {
                return Poll::Ready(None);
            };
            match step {
                Step::Wait(d) => {
                    let sleep = this
                        .sleep
                        .get_or_insert_with(|| Box::pin(tokio::time::sleep(d)));
                    if sleep.poll_unpin(cx).is_pending() {
                        return Poll::Pending;
                    }
                    this.sleep = None;
                    this.steps.pop_front();
                }
                Step::Hang => return Poll::Pending,
                Step::Chunk(c) => {
                    this.steps.pop_front();
                    return Poll::Ready(Some(Ok(StreamEvent::Chunk(Chunk::text(c)))));
                }
                Step::KeepAlive => {
                    this.steps.pop_front();
                    return Poll::Ready(Some(Ok(StreamEvent::KeepAlive)));
                }
                Step::Fail => {
                    this.steps.pop_front();
                    this.steps.clear();
                    return Poll::Ready(Some(Err(StreamErrorKind::Provider {
                        message: "boom".into(),
                    }
                    .into())));
                }
            }
        }
    }
}

#[async_trait]
impl Close for Recording {
    async fn close(&mut self) -> Result<(), CloseError> {
        match self.close {
            CloseKind::AsyncOnly(d) => {
                self.log.push("close");
                tokio::time::sleep(d).await;
                self.log.push("closed");
                Ok(())
            }
            CloseKind::AsyncFails => {
                self.log.push("close");
                Err(CloseError::Failed("the server did not acknowledge".into()))
            }
            _ => self.close_now(),
        }
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        match self.close {
            CloseKind::Sync | CloseKind::AsyncFails => {
                self.log.push("close");
                self.log.push("closed");
                Ok(())
            }
            CloseKind::AsyncOnly(_) => Err(CloseError::AsyncOnly),
            CloseKind::Panics => {
                self.log.push("close");
                panic!("a provider's close panicked")
            }
        }
    }
}

pub fn chunk(text: &str) -> Option<Result<StreamEvent, StreamError>> {
    Some(Ok(StreamEvent::Chunk(Chunk::text(text))))
}
