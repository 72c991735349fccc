//! [`Guarded`]: the wrapper that closes a provider stream exactly once, on
//! every path (G4).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use async_trait::async_trait;
use futures_util::stream::{FusedStream, Stream};
use futures_util::FutureExt;
use pin_project_lite::pin_project;

use crate::close::{close_best_effort, close_now_logged, close_without_waiting, Close};
use crate::{CloseError, StreamError};

type CloseFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

enum State<S> {
    Open(S),
    Closing(CloseFuture),
    Closed,
}

pin_project! {
    /// Wraps a provider stream and closes it exactly once: when it ends, when
    /// it yields an error, on [`close`](Close::close), and on drop.
    ///
    /// The close completes before the end or the error reaches the consumer,
    /// so a consumer that has seen the end knows the stream is closed. After
    /// an error the stream is over: it yields `None`.
    ///
    /// On drop the inner stream's sync close runs in place; a stream that can
    /// only close asynchronously (or a close already in flight) is handed to
    /// the current tokio runtime without blocking the dropper.
    ///
    /// The inner stream must be `Unpin + Send + 'static` because a drop may
    /// need to move it onto the runtime; box a stream that is not
    /// (`Box::pin(stream)` is `Unpin`).
    pub struct Guarded<S, E = StreamError>
    where
        S: Close,
        S: Unpin,
        S: 'static,
    {
        state: State<S>,
        // The error that ended the stream, held back until the close is done.
        // Its type is a parameter rather than a projection of `S::Item`,
        // which the compiler cannot prove `Send` inside async blocks.
        error: Option<E>,
    }

    impl<S, E> PinnedDrop for Guarded<S, E>
    where
        S: Close,
        S: Unpin,
        S: 'static,
    {
        fn drop(this: Pin<&mut Self>) {
            this.project().state.close_without_waiting();
        }
    }
}

impl<S> State<S>
where
    S: Close + 'static,
{
    fn start_close(&mut self) {
        if let State::Open(_) = self {
            if let State::Open(mut stream) = std::mem::replace(self, State::Closed) {
                // A close with nothing to wait for runs here, with no future.
                if stream.close_waits() {
                    *self = State::Closing(Box::pin(async move {
                        close_best_effort(&mut stream).await;
                    }));
                } else {
                    close_now_logged(&mut stream);
                }
            }
        }
    }

    fn poll_close(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.start_close();
        if let State::Closing(close) = self {
            ready!(close.poll_unpin(cx));
            *self = State::Closed;
        }
        Poll::Ready(())
    }

    fn close_without_waiting(&mut self) {
        match std::mem::replace(self, State::Closed) {
            State::Open(stream) => close_without_waiting(stream),
            State::Closing(close) => hand_off(close),
            State::Closed => {}
        }
    }
}

/// The stream has ended: finish its close, then report the held-back error.
#[cold]
#[inline(never)]
fn poll_end<S, T, E>(
    state: &mut State<S>,
    error: &mut Option<E>,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<T, E>>>
where
    S: Close + 'static,
{
    ready!(state.poll_close(cx));
    Poll::Ready(error.take().map(Err))
}

/// Lets a close that is already in flight finish on the runtime.
fn hand_off(close: CloseFuture) {
    match tokio::runtime::Handle::try_current() {
        Ok(runtime) => {
            runtime.spawn(close);
        }
        Err(_) => tracing::warn!(
            "a provider stream was dropped mid-close outside a tokio runtime; its close is abandoned"
        ),
    }
}

impl<S, T, E> Guarded<S, E>
where
    S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
{
    /// Guards `stream`. Nothing is polled until the wrapper is.
    pub fn new(stream: S) -> Self {
        Guarded {
            state: State::Open(stream),
            error: None,
        }
    }
}

impl<S, E> Guarded<S, E>
where
    S: Close + Unpin + 'static,
{
    /// The inner stream while it is open.
    pub fn get_ref(&self) -> Option<&S> {
        match &self.state {
            State::Open(stream) => Some(stream),
            _ => None,
        }
    }

    /// Whether the inner stream's close has finished (or been handed to the
    /// runtime).
    pub fn is_closed(&self) -> bool {
        matches!(self.state, State::Closed)
    }

    /// Drive the close of the inner stream; `Ready` once it is done. Starts
    /// the close if it has not started yet. Safe to call again.
    pub fn poll_close(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.project().state.poll_close(cx)
    }
}

impl<S, T, E> Stream for Guarded<S, E>
where
    S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
{
    type Item = Result<T, E>;

    #[inline(always)]
    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.project();
        if let State::Open(stream) = this.state {
            match ready!(Pin::new(stream).poll_next(cx)) {
                Some(Ok(item)) => return Poll::Ready(Some(Ok(item))),
                Some(Err(error)) => *this.error = Some(error),
                None => {}
            }
        }
        poll_end(this.state, this.error, cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        match &self.state {
            State::Open(stream) => (0, stream.size_hint().1.map(|n| n + 1)),
            _ => (usize::from(self.error.is_some()), Some(1)),
        }
    }
}

impl<S, T, E> FusedStream for Guarded<S, E>
where
    S: Stream<Item = Result<T, E>> + Close + Unpin + 'static,
{
    fn is_terminated(&self) -> bool {
        self.is_closed() && self.error.is_none()
    }
}

#[async_trait]
impl<S, E> Close for Guarded<S, E>
where
    S: Close + Unpin + 'static,
    E: Send,
{
    async fn close(&mut self) -> Result<(), CloseError> {
        std::future::poll_fn(|cx| Pin::new(&mut *self).poll_close(cx)).await;
        Ok(())
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        self.state.close_without_waiting();
        Ok(())
    }

    fn close_waits(&self) -> bool {
        match &self.state {
            State::Open(stream) => stream.close_waits(),
            State::Closing(_) => true,
            State::Closed => false,
        }
    }
}

impl<S, E> fmt::Debug for Guarded<S, E>
where
    S: Close + Unpin + 'static,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Open(_) => "open",
            State::Closing(_) => "closing",
            State::Closed => "closed",
        };
        f.debug_struct("Guarded").field("state", &state).finish()
    }
}
