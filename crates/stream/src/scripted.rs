//! The scripted provider of SPEC §8: plays turn scripts, deterministically
//! under tokio's paused clock, so every lifecycle path can run without a
//! model server.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{FutureExt, Stream};
use settle_core::UnknownWord;
use tokio::time::Sleep;

use crate::close::Close;
use crate::{
    Chunk, CloseError, Provider, ProviderStream, Request, StreamError, StreamErrorKind, StreamEvent,
};

/// How a scripted turn ends, after its chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ScriptedEnd {
    /// A normal end.
    #[default]
    Complete,
    /// A provider error.
    Fail,
    /// Nothing more and no end, until the stream is closed (the idle timeout
    /// must fire).
    Hang,
    /// The provider cancels the turn itself.
    SelfCancel,
    /// Like `Complete`, but a close that arrives before the end (a cancel) is
    /// ignored for the script's `ignore` duration before the stream stops,
    /// like a blocking call that cannot be interrupted.
    IgnoreCancel,
}

impl ScriptedEnd {
    /// Every value, in declaration order.
    pub const ALL: &'static [ScriptedEnd] = &[
        ScriptedEnd::Complete,
        ScriptedEnd::Fail,
        ScriptedEnd::Hang,
        ScriptedEnd::SelfCancel,
        ScriptedEnd::IgnoreCancel,
    ];

    /// The spelling used in scenario files.
    pub const fn as_str(self) -> &'static str {
        match self {
            ScriptedEnd::Complete => "complete",
            ScriptedEnd::Fail => "fail",
            ScriptedEnd::Hang => "hang",
            ScriptedEnd::SelfCancel => "self_cancel",
            ScriptedEnd::IgnoreCancel => "ignore_cancel",
        }
    }
}

impl fmt::Display for ScriptedEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ScriptedEnd {
    type Err = UnknownWord;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ScriptedEnd::ALL
            .iter()
            .copied()
            .find(|end| end.as_str() == s)
            .ok_or_else(|| UnknownWord {
                word: s.to_owned(),
                kind: "turn end",
                expected: "complete, fail, hang, self_cancel, ignore_cancel",
            })
    }
}

/// Where a scripted turn panics: for tests that a panicking provider still
/// ends its turn (failed, kind `panic`) with its stream closed (G4). Not a
/// turn end of scenario files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScriptedPanic {
    /// `open` panics; no stream exists.
    InOpen,
    /// The stream's `poll_next` panics after its chunks, in place of its end.
    MidStream,
}

/// The default time an `ignore_cancel` turn ignores its cancellation.
pub const DEFAULT_IGNORE: Duration = Duration::from_secs(60);

/// One scripted turn (a `[[agent.turn]]` of a scenario file).
///
/// Plain data: build it with the pub fields or the builder methods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnScript {
    /// The chunks, in order.
    pub chunks: Vec<String>,
    /// The wait before each chunk.
    pub chunk_delay: Duration,
    /// How the turn ends after its chunks.
    pub end: ScriptedEnd,
    /// How long closing the stream takes.
    pub close_delay: Duration,
    /// How long an `ignore_cancel` turn ignores its cancellation.
    pub ignore: Duration,
    /// Where the turn panics, if it does.
    pub panic: Option<ScriptedPanic>,
}

impl Default for TurnScript {
    fn default() -> Self {
        TurnScript {
            chunks: Vec::new(),
            chunk_delay: Duration::ZERO,
            end: ScriptedEnd::Complete,
            close_delay: Duration::ZERO,
            ignore: DEFAULT_IGNORE,
            panic: None,
        }
    }
}

impl TurnScript {
    /// A turn of these chunks that completes, with no delays.
    pub fn new<I, T>(chunks: I) -> Self
    where
        I: IntoIterator<Item = T>,
        T: Into<String>,
    {
        TurnScript {
            chunks: chunks.into_iter().map(Into::into).collect(),
            ..TurnScript::default()
        }
    }

    /// Sets the wait before each chunk.
    pub fn chunk_delay(mut self, delay: Duration) -> Self {
        self.chunk_delay = delay;
        self
    }

    /// Sets how the turn ends.
    pub fn end(mut self, end: ScriptedEnd) -> Self {
        self.end = end;
        self
    }

    /// Sets how long closing the stream takes.
    pub fn close_delay(mut self, delay: Duration) -> Self {
        self.close_delay = delay;
        self
    }

    /// Sets how long an `ignore_cancel` turn ignores its cancellation.
    pub fn ignore(mut self, ignore: Duration) -> Self {
        self.ignore = ignore;
        self
    }

    /// Makes the turn panic at `at`.
    pub fn panic(mut self, at: ScriptedPanic) -> Self {
        self.panic = Some(at);
        self
    }
}

/// What a [`ScriptedProvider`] has done so far, for tests and reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ScriptStats {
    /// Streams opened.
    pub opened: usize,
    /// Closes started (each stream at most once, G4).
    pub close_started: usize,
    /// Closes finished.
    pub close_finished: usize,
}

#[derive(Default)]
struct Counters {
    opened: AtomicUsize,
    close_started: AtomicUsize,
    close_finished: AtomicUsize,
}

/// A provider that plays its turn scripts in order, one per `open`.
#[derive(Clone)]
pub struct ScriptedProvider {
    turns: Arc<Mutex<VecDeque<TurnScript>>>,
    counters: Arc<Counters>,
}

impl fmt::Debug for ScriptedProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedProvider")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl ScriptedProvider {
    /// A provider that plays `turns`, one per opened stream.
    pub fn new(turns: impl IntoIterator<Item = TurnScript>) -> Self {
        ScriptedProvider {
            turns: Arc::new(Mutex::new(turns.into_iter().collect())),
            counters: Arc::default(),
        }
    }

    /// Opens the next turn's stream without the async trait; the stream is
    /// lazy, nothing happens until it is polled.
    ///
    /// Panics if the turn's script says so ([`ScriptedPanic::InOpen`]).
    pub fn open_next(&self) -> Result<ScriptedStream, StreamError> {
        let script = self
            .turns
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop_front()
            .ok_or_else(|| StreamError::from(StreamErrorKind::ScriptExhausted))?;
        if script.panic == Some(ScriptedPanic::InOpen) {
            panic!("the scripted provider panics in open");
        }
        self.counters.opened.fetch_add(1, Ordering::Relaxed);
        Ok(ScriptedStream {
            chunks: script.chunks.into_iter().map(Chunk::text).collect(),
            script_end: script.end,
            chunk_delay: script.chunk_delay,
            close_delay: script.close_delay,
            ignore: script.ignore,
            panic: script.panic == Some(ScriptedPanic::MidStream),
            sleep: None,
            ended: false,
            counters: self.counters.clone(),
        })
    }

    /// How many streams were opened and closed so far.
    pub fn stats(&self) -> ScriptStats {
        ScriptStats {
            opened: self.counters.opened.load(Ordering::Relaxed),
            close_started: self.counters.close_started.load(Ordering::Relaxed),
            close_finished: self.counters.close_finished.load(Ordering::Relaxed),
        }
    }
}

#[async_trait]
impl Provider for ScriptedProvider {
    async fn open(&self, _request: &Request) -> Result<ProviderStream, StreamError> {
        Ok(Box::new(self.open_next()?))
    }
}

/// The stream of one scripted turn.
pub struct ScriptedStream {
    chunks: VecDeque<Chunk>,
    script_end: ScriptedEnd,
    chunk_delay: Duration,
    close_delay: Duration,
    ignore: Duration,
    panic: bool,
    sleep: Option<Pin<Box<Sleep>>>,
    ended: bool,
    counters: Arc<Counters>,
}

impl fmt::Debug for ScriptedStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedStream")
            .field("chunks_left", &self.chunks.len())
            .field("end", &self.script_end)
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

impl ScriptedStream {
    /// How long the close takes: a cancel of an unfinished `ignore_cancel`
    /// turn is ignored for a while first.
    fn close_time(&self) -> Duration {
        let ignoring = self.script_end == ScriptedEnd::IgnoreCancel && !self.ended;
        if ignoring {
            self.ignore + self.close_delay
        } else {
            self.close_delay
        }
    }
}

impl Stream for ScriptedStream {
    type Item = Result<StreamEvent, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.ended {
            return Poll::Ready(None);
        }
        if !this.chunks.is_empty() {
            if !this.chunk_delay.is_zero() {
                let delay = this.chunk_delay;
                let sleep = this
                    .sleep
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
                ready!(sleep.poll_unpin(cx));
                this.sleep = None;
            }
            return Poll::Ready(this.chunks.pop_front().map(|c| Ok(StreamEvent::Chunk(c))));
        }
        if this.panic {
            panic!("the scripted stream panics mid-stream");
        }
        let end = match this.script_end {
            ScriptedEnd::Complete | ScriptedEnd::IgnoreCancel => None,
            ScriptedEnd::Fail => Some(Err(StreamErrorKind::Provider {
                message: "the scripted turn fails here".to_owned(),
            }
            .into())),
            ScriptedEnd::SelfCancel => Some(Err(StreamErrorKind::SelfCancelled.into())),
            // Registers no waker on purpose: only a timeout or a close (both
            // outside this stream) can end a hung provider.
            ScriptedEnd::Hang => return Poll::Pending,
        };
        this.ended = true;
        Poll::Ready(end)
    }
}

#[async_trait]
impl Close for ScriptedStream {
    async fn close(&mut self) -> Result<(), CloseError> {
        self.counters.close_started.fetch_add(1, Ordering::Relaxed);
        let time = self.close_time();
        self.ended = true;
        if !time.is_zero() {
            tokio::time::sleep(time).await;
        }
        self.counters.close_finished.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn close_waits(&self) -> bool {
        !self.close_time().is_zero()
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        if !self.close_time().is_zero() {
            return Err(CloseError::AsyncOnly);
        }
        self.counters.close_started.fetch_add(1, Ordering::Relaxed);
        self.ended = true;
        self.counters.close_finished.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}
