//! [`IdleTimeout`]: ends a stream whose provider has gone quiet.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{FusedStream, Stream};
use tokio::time::{Instant, Sleep};

use crate::close::Close;
use crate::{CloseError, FirstEventTimedOut, IdleTimedOut, StreamItem};

/// Ends a stream with a typed error when the provider sends no event for
/// `idle`, or no first event within `first` (by default the idle value).
///
/// It times out and does nothing else: closing is [`Guarded`](crate::Guarded)'s
/// job, so wrap it once, `Guarded::new(IdleTimeout::new(stream, idle))`, and
/// the stream is closed before the timeout reaches the consumer (G4). Alone,
/// it yields the error and then ends, and [`Close`] reaches the inner stream.
///
/// Keepalives ([`StreamItem::is_keepalive`]) are passed through but are not
/// events: a provider that only sends keepalives times out. A zero
/// duration disables its timeout, and so does one too long to be added to
/// the clock (`Duration::MAX`): a deadline that cannot be reached never fires.
///
/// Idle time is the time the consumer spends waiting for the next event.
/// No timer is touched per item: the wrapper remembers when the current
/// wait began and re-arms its one `Sleep` only when it fires before the
/// deadline, comparing with the clock itself. Items that are ready
/// immediately never read the clock.
///
/// The clock is tokio's, so tests can use a paused clock. The timer is
/// created at the first poll that has to wait, which must be inside a
/// tokio runtime with the time driver enabled.
pub struct IdleTimeout<S> {
    inner: S,
    idle: Option<Duration>,
    first: Option<Duration>,
    // When the consumer began waiting with nothing ready; `None` while items
    // are flowing, so a ready item costs no clock read.
    waiting_since: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
    got_first: bool,
    done: bool,
}

fn enabled(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

impl<S, T, E> IdleTimeout<S>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    T: StreamItem,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    /// Times out `stream` after `idle` without an event; the first event
    /// gets the same time unless [`first_event`](Self::first_event) says
    /// otherwise. `Duration::ZERO` disables.
    pub fn new(stream: S, idle: Duration) -> Self {
        IdleTimeout {
            inner: stream,
            idle: enabled(idle),
            first: enabled(idle),
            waiting_since: None,
            sleep: None,
            got_first: false,
            done: false,
        }
    }

    /// Sets the first-event timeout; `Duration::ZERO` disables it.
    pub fn first_event(mut self, first: Duration) -> Self {
        self.first = enabled(first);
        self
    }
}

impl<S> IdleTimeout<S> {
    /// The idle timeout, `None` if disabled.
    pub fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// The first-event timeout, `None` if disabled.
    pub fn first(&self) -> Option<Duration> {
        self.first
    }

    /// The wrapped stream.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The timeout that applies now and whether it is the first-event one.
    fn limit(&self) -> (Option<Duration>, bool) {
        if self.got_first {
            (self.idle, false)
        } else {
            (self.first, true)
        }
    }
}

impl<S, T, E> Stream for IdleTimeout<S>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    T: StreamItem,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    type Item = Result<T, E>;

    #[inline(always)]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // The hot path: a ready event costs a poll and two stores, no clock.
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_next(cx) {
            Poll::Ready(Some(Ok(item))) => {
                if item.is_keepalive() {
                    return this.keepalive(item, cx);
                }
                this.got_first = true;
                this.waiting_since = None;
                Poll::Ready(Some(Ok(item)))
            }
            Poll::Ready(end) => this.end(end),
            Poll::Pending => this.poll_wait(cx),
        }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.done {
            return (0, Some(0));
        }
        // A timeout may add one item (its error).
        let (_, upper) = self.inner.size_hint();
        (0, upper.and_then(|n| n.checked_add(1)))
    }
}

impl<S, T, E> IdleTimeout<S>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    T: StreamItem,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    #[cold]
    fn end(&mut self, end: Option<Result<T, E>>) -> Poll<Option<Result<T, E>>> {
        self.done = true;
        self.sleep = None;
        Poll::Ready(end)
    }

    /// A keepalive arrived. A provider that sends them back to back never
    /// leaves us waiting on the timer, so check the deadline here.
    #[cold]
    fn keepalive(&mut self, item: T, cx: &mut Context<'_>) -> Poll<Option<Result<T, E>>> {
        let overdue = match (self.limit().0, self.waiting_since) {
            (Some(limit), Some(since)) => since
                .checked_add(limit)
                .is_some_and(|deadline| Instant::now() >= deadline),
            _ => false,
        };
        if overdue {
            return self.poll_wait(cx);
        }
        Poll::Ready(Some(Ok(item)))
    }

    /// Nothing is ready: wait on the timer, and once it has fired, report
    /// the timeout and end.
    #[cold]
    #[inline(never)]
    fn poll_wait(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<T, E>>> {
        let (limit, first) = self.limit();
        let Some(limit) = limit else {
            return Poll::Pending;
        };
        let since = *self.waiting_since.get_or_insert_with(Instant::now);
        // A deadline past the end of the clock never comes.
        let Some(deadline) = since.checked_add(limit) else {
            return Poll::Pending;
        };
        let sleep = match &mut self.sleep {
            Some(sleep) => {
                // Only the switch from a long first-event timeout to a
                // shorter idle one can leave the timer armed too late.
                if sleep.deadline() > deadline {
                    sleep.as_mut().reset(deadline);
                }
                sleep
            }
            None => self
                .sleep
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        loop {
            ready!(sleep.as_mut().poll(cx));
            if Instant::now() >= deadline {
                break;
            }
            // Armed for an earlier wait: the events since then moved the
            // deadline. Re-arm once, here, instead of on every event.
            sleep.as_mut().reset(deadline);
        }
        let error = if first {
            FirstEventTimedOut { first: limit }.into()
        } else {
            IdleTimedOut { idle: limit }.into()
        };
        self.end(Some(Err(error)))
    }
}

impl<S, T, E> FusedStream for IdleTimeout<S>
where
    S: Stream<Item = Result<T, E>> + Unpin,
    T: StreamItem,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    fn is_terminated(&self) -> bool {
        self.done
    }
}

#[async_trait]
impl<S: Close> Close for IdleTimeout<S> {
    async fn close(&mut self) -> Result<(), CloseError> {
        self.sleep = None;
        self.inner.close().await
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        self.sleep = None;
        self.inner.close_now()
    }

    fn close_waits(&self) -> bool {
        self.inner.close_waits()
    }
}

impl<S> fmt::Debug for IdleTimeout<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleTimeout")
            .field("idle", &self.idle)
            .field("first", &self.first)
            .field("got_first", &self.got_first)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}
