//! [`DropClose`]: any stream of events as a provider stream, closed by
//! dropping what it holds.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use futures_util::Stream;

use crate::close::Close;
use crate::{CloseError, StreamError, StreamEvent};

/// A provider stream made of any `Stream` of events whose close is its
/// drop: a gRPC call, a channel fed by a local model, a canned reply for a
/// test. Closing drops the inner stream at once (and with it whatever it
/// holds); after that it yields nothing.
///
/// ```
/// use futures_util::stream;
/// use settle_stream::{Chunk, DropClose, ProviderStream, StreamEvent};
///
/// let events = stream::iter([Ok(StreamEvent::Chunk(Chunk::text("hi")))]);
/// let stream: ProviderStream = Box::new(DropClose::new(events));
/// # drop(stream);
/// ```
pub struct DropClose<S> {
    inner: Option<S>,
}

impl<S> fmt::Debug for DropClose<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DropClose")
            .field("open", &self.inner.is_some())
            .finish()
    }
}

impl<S> DropClose<S> {
    /// A provider stream of `inner`'s events.
    pub fn new(inner: S) -> Self {
        DropClose { inner: Some(inner) }
    }
}

impl<S> Stream for DropClose<S>
where
    S: Stream<Item = Result<StreamEvent, StreamError>> + Unpin,
{
    type Item = Result<StreamEvent, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        match self.inner.as_mut() {
            Some(inner) => Pin::new(inner).poll_next(cx),
            None => Poll::Ready(None),
        }
    }
}

#[async_trait::async_trait]
impl<S: Send> Close for DropClose<S> {
    fn close_waits(&self) -> bool {
        false
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        self.inner = None;
        Ok(())
    }
}
