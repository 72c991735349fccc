//! [`IdleTimeout`]: ends a stream whose provider has gone quiet, and closes it.

use std::fmt;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::stream::{FusedStream, Stream};
use futures_util::FutureExt;
use pin_project_lite::pin_project;
use tokio::time::{Instant, Sleep};

use crate::close::Close;
use crate::{CloseError, Event, FirstEventTimedOut, Guarded, IdleTimedOut, StreamError};

/// Which timeout ended the stream, kept until the inner close is done.
enum Fired {
    Idle(Duration),
    First(Duration),
}

pin_project! {
    /// Ends a stream with a typed error when the provider sends no event for
    /// `idle`, or no first event within `first` (by default the idle value),
    /// and closes the inner stream before the error reaches the consumer.
    ///
    /// Keepalives ([`Event::is_keepalive`]) are passed through but are not
    /// events: a provider that only sends keepalives times out. A zero
    /// duration disables its timeout.
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
    pub struct IdleTimeout<S, E = StreamError>
    where
        S: Close,
        S: Unpin,
        S: 'static,
    {
        #[pin]
        inner: Guarded<S, E>,
        idle: Option<Duration>,
        first: Option<Duration>,
        got_first: bool,
        // When the consumer began waiting with nothing ready; `None` while
        // items are flowing, so a ready item costs no clock read.
        waiting_since: Option<Instant>,
        sleep: Option<Pin<Box<Sleep>>>,
        fired: Option<Fired>,
        done: bool,
    }
}

fn enabled(d: Duration) -> Option<Duration> {
    (!d.is_zero()).then_some(d)
}

impl<S, T, E> IdleTimeout<S, E>
where
    S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
    T: Event,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    /// Times out `stream` after `idle` without an event; the first event
    /// gets the same time unless [`first_event`](Self::first_event) says
    /// otherwise. `Duration::ZERO` disables.
    pub fn new(stream: S, idle: Duration) -> Self {
        IdleTimeout {
            inner: Guarded::new(stream),
            idle: enabled(idle),
            first: enabled(idle),
            got_first: false,
            waiting_since: None,
            sleep: None,
            fired: None,
            done: false,
        }
    }

    /// Sets the first-event timeout; `Duration::ZERO` disables it.
    pub fn first_event(mut self, first: Duration) -> Self {
        self.first = enabled(first);
        self
    }

    /// The idle timeout, `None` if disabled.
    pub fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// The first-event timeout, `None` if disabled.
    pub fn first(&self) -> Option<Duration> {
        self.first
    }
}

impl<S, T, E> Stream for IdleTimeout<S, E>
where
    S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
    T: Event,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    type Item = Result<T, E>;

    #[inline]
    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // The hot path: a ready event costs a poll and two stores, no clock.
        let this = self.as_mut().project();
        if !*this.done && this.fired.is_none() {
            match this.inner.poll_next(cx) {
                Poll::Ready(Some(Ok(item))) => {
                    if !item.is_keepalive() {
                        *this.got_first = true;
                        if this.waiting_since.is_some() {
                            *this.waiting_since = None;
                        }
                        return Poll::Ready(Some(Ok(item)));
                    }
                    return self.keepalive(item, cx);
                }
                Poll::Ready(end) => {
                    *this.done = true;
                    return Poll::Ready(end);
                }
                Poll::Pending => {}
            }
        }
        self.poll_wait(cx)
    }
}

impl<S, T, E> IdleTimeout<S, E>
where
    S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
    T: Event,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    /// The timeout that applies now and whether it is the first-event one.
    fn limit(&self) -> (Option<Duration>, bool) {
        if self.got_first {
            (self.idle, false)
        } else {
            (self.first, true)
        }
    }

    /// A keepalive arrived. A provider that sends them back to back never
    /// leaves us waiting on the timer, so check the deadline here.
    #[cold]
    fn keepalive(
        mut self: Pin<&mut Self>,
        item: T,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<T, E>>> {
        let overdue = match (self.limit().0, self.waiting_since) {
            (Some(limit), Some(since)) => Instant::now() >= since + limit,
            _ => false,
        };
        if !overdue {
            return Poll::Ready(Some(Ok(item)));
        }
        self.as_mut().poll_wait(cx)
    }

    /// Nothing is ready: wait on the timer, and once it has fired, close the
    /// inner stream and report the timeout.
    #[cold]
    #[inline(never)]
    fn poll_wait(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<T, E>>> {
        let (limit, first) = self.limit();
        let mut this = self.project();
        if *this.done {
            return Poll::Ready(None);
        }
        if this.fired.is_none() {
            let Some(limit) = limit else {
                return Poll::Pending;
            };
            let since = *this.waiting_since.get_or_insert_with(Instant::now);
            let deadline = since + limit;
            let sleep = match this.sleep {
                Some(sleep) => {
                    // Only the switch from a long first-event timeout to a
                    // shorter idle one can leave the timer armed too late.
                    if sleep.deadline() > deadline {
                        sleep.as_mut().reset(deadline);
                    }
                    sleep
                }
                None => this
                    .sleep
                    .insert(Box::pin(tokio::time::sleep_until(deadline))),
            };
            loop {
                ready!(sleep.poll_unpin(cx));
                if Instant::now() >= deadline {
                    break;
                }
                sleep.as_mut().reset(deadline);
            }
            *this.sleep = None;
            *this.fired = Some(if first {
                Fired::First(limit)
            } else {
                Fired::Idle(limit)
            });
        }
        ready!(this.inner.as_mut().poll_close(cx));
        *this.done = true;
        Poll::Ready(this.fired.take().map(|fired| {
            Err(match fired {
                Fired::Idle(idle) => IdleTimedOut { idle }.into(),
                Fired::First(first) => FirstEventTimedOut { first }.into(),
            })
        }))
    }
}

impl<S, T, E> FusedStream for IdleTimeout<S, E>
where
    S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
    T: Event,
    E: From<IdleTimedOut> + From<FirstEventTimedOut>,
{
    fn is_terminated(&self) -> bool {
        self.done
    }
}

#[async_trait]
impl<S, E> Close for IdleTimeout<S, E>
where
    S: Close + Unpin + 'static,
    E: Send,
{
    async fn close(&mut self) -> Result<(), CloseError> {
        self.sleep = None;
        self.inner.close().await
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        self.sleep = None;
        self.inner.close_now()
    }
}

impl<S, E> fmt::Debug for IdleTimeout<S, E>
where
    S: Close + Unpin + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IdleTimeout")
            .field("inner", &self.inner)
            .field("idle", &self.idle)
            .field("first", &self.first)
            .field("got_first", &self.got_first)
            .finish_non_exhaustive()
    }
}
