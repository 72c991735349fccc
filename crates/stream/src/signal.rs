//! What a work reports while it runs, and how it ended.

use settle_core::{Outcome, TurnError};
use tokio::sync::mpsc::UnboundedSender;

use crate::StreamError;

/// Who cancelled a work.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CancelledBy {
    /// A cancel request: the work's scope was cancelled.
    Request,
    /// The provider cancelled the turn itself; it must not be cancelled
    /// again (G6).
    Provider,
    /// Its stream was closed from outside
    /// ([`WorkControl::close_stream`](crate::WorkControl::close_stream)).
    ForceClose,
    /// The chunk sink refused a chunk as closed: nobody may receive it.
    SinkClosed,
}

/// How a work ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkEnd {
    /// The provider's stream ended normally.
    Completed,
    /// The provider failed (it could not be reached, answered an error
    /// status, sent something malformed, reported an error, cut the reply
    /// short), or the sink failed to deliver a chunk.
    Failed(TurnError),
    /// The idle or first-event timeout ran out; the error's kind is
    /// `timeout` and its message says which.
    IdleTimeout(TurnError),
    /// The work was cancelled.
    Cancelled(CancelledBy),
    /// The work panicked (in the provider's `open`, in its stream, in the
    /// sink); the error's kind is `panic` and its message the panic's. Its
    /// stream, if one was open, was closed by drop (G4).
    Panicked(TurnError),
    /// The work's task was dropped before it ended without being detached:
    /// the tokio runtime it ran on shut down.
    Abandoned,
}

impl WorkEnd {
    /// The outcome vocabulary word for this end.
    pub fn outcome(&self) -> Outcome {
        match self {
            WorkEnd::Completed => Outcome::Completed,
            WorkEnd::Failed(_) | WorkEnd::Panicked(_) => Outcome::Failed,
            WorkEnd::IdleTimeout(_) => Outcome::IdleTimeout,
            WorkEnd::Cancelled(_) => Outcome::Cancelled,
            WorkEnd::Abandoned => Outcome::Detached,
        }
    }

    /// Why the work failed or timed out; `None` for the other ends.
    pub fn error(&self) -> Option<&TurnError> {
        match self {
            WorkEnd::Failed(e) | WorkEnd::IdleTimeout(e) | WorkEnd::Panicked(e) => Some(e),
            _ => None,
        }
    }

    pub(crate) fn from_error(error: &StreamError) -> WorkEnd {
        match error.outcome() {
            Outcome::IdleTimeout => WorkEnd::IdleTimeout(error.turn_error()),
            Outcome::Cancelled => WorkEnd::Cancelled(CancelledBy::Provider),
            _ => WorkEnd::Failed(error.turn_error()),
        }
    }
}

/// What a work reports, in this order: [`StreamAttached`] once its stream
/// exists and is attached to its scope, [`StreamClosed`] once that stream
/// is closed, and [`Ended`] exactly once, last, on every path (a panic
/// included). A work that never opened a stream reports only its end.
///
/// A detached work reports nothing more; a signal it was sending at the very
/// moment of the detach may still arrive, so a driver ignores the signals of
/// a work it no longer holds (the key of [`Keyed`] says which work it is).
///
/// [`StreamAttached`]: WorkSignal::StreamAttached
/// [`StreamClosed`]: WorkSignal::StreamClosed
/// [`Ended`]: WorkSignal::Ended
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkSignal {
    /// The provider's stream is open and attached to the work's scope: a
    /// cancel or force close reaches it from now on.
    StreamAttached,
    /// The stream is closed (its close finished, or was handed to the
    /// runtime because the work was unwinding).
    StreamClosed,
    /// Opening the stream failed before any chunk and is tried again
    /// (see [`RetryPolicy`](crate::RetryPolicy)).
    Retrying {
        /// Which retry this is, from 1.
        attempt: u32,
        /// How long the work waits before it.
        delay: std::time::Duration,
        /// Whether the fallback provider is tried.
        fallback: bool,
        /// Why the opening failed.
        error: TurnError,
    },
    /// A usage report was delivered to the sink: what its budget counts.
    Usage {
        /// The tokens it counts ([`usage_tokens`](crate::usage_tokens)).
        tokens: u64,
    },
    /// The work ended, and how.
    Ended(WorkEnd),
}

/// Where a work's [`WorkSignal`]s go. Called from the work's task; it must
/// neither block nor panic.
pub trait SignalSink: Send + 'static {
    /// Delivers one signal.
    fn signal(&mut self, signal: WorkSignal);
}

/// Tags each signal with the caller's key (a work id) and sends it on a
/// channel that the driver drains in batches (`recv_many`).
///
/// ```
/// use tokio::sync::mpsc;
/// use settle_stream::{Keyed, SignalSink, WorkSignal};
///
/// let (tx, mut rx) = mpsc::unbounded_channel();
/// let mut signals = Keyed::new(7_u64, tx);
/// signals.signal(WorkSignal::StreamAttached);
/// assert_eq!(rx.try_recv().unwrap(), (7, WorkSignal::StreamAttached));
/// ```
#[derive(Debug, Clone)]
pub struct Keyed<K> {
    key: K,
    sender: UnboundedSender<(K, WorkSignal)>,
}

impl<K> Keyed<K> {
    /// Signals tagged with `key`, sent on `sender`.
    pub fn new(key: K, sender: UnboundedSender<(K, WorkSignal)>) -> Self {
        Keyed { key, sender }
    }

    /// The key the signals carry.
    pub fn key(&self) -> &K {
        &self.key
    }
}

impl<K: Clone + Send + 'static> SignalSink for Keyed<K> {
    fn signal(&mut self, signal: WorkSignal) {
        // A receiver that is gone wants no more signals.
        let _ = self.sender.send((self.key.clone(), signal));
    }
}
