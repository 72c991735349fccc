//! The [`Provider`] trait: what turns a request into a closable stream of
//! events.

use async_trait::async_trait;
use futures_util::Stream;

use crate::close::Close;
use crate::{Request, StreamError, StreamEvent};

/// A provider stream: events until the end, at most one error, closable.
pub trait EventStream:
    Stream<Item = Result<StreamEvent, StreamError>> + Close + Unpin + Send
{
}

impl<T> EventStream for T where
    T: Stream<Item = Result<StreamEvent, StreamError>> + Close + Unpin + Send
{
}

/// The stream a [`Provider`] opens.
pub type ProviderStream = Box<dyn EventStream>;

/// A model provider: opens one stream per turn.
///
/// `open` may do I/O (send the request, wait for the response headers); it
/// must not read events, so a stream is attached to its work's scope before
/// it produces anything. If the future is dropped (the turn was cancelled
/// while it was opening), whatever it had opened must be released by drop;
/// wrap it in [`Guarded`](crate::Guarded) as soon as it exists to have it
/// closed too.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Opens the stream of one turn.
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError>;

    /// Opens the stream of one turn whose first event is due by `due` (the
    /// open, its retries and the wait for the first event share that one
    /// deadline; `None`: no deadline). A provider that waits for more than
    /// the response's headers before it answers (the start of an error
    /// body, to quote it) ends that wait early enough for its answer to be
    /// told before the deadline, as itself, rather than as the deadline's
    /// timeout. By default, [`open`](Self::open).
    async fn open_by(
        &self,
        request: &Request,
        due: Option<tokio::time::Instant>,
    ) -> Result<ProviderStream, StreamError> {
        let _ = due;
        self.open(request).await
    }

    /// Waits until whatever an open that was dropped (the turn cancelled
    /// while its stream was being opened) had started is released. Only a
    /// provider whose drop cannot release it at once needs it: one that
    /// opens its stream on another event loop or thread, and closes it
    /// there. A cancelled work waits for it before it ends, so its session
    /// settles only once it is released, or once its work is detached at
    /// the settle deadline (G5); a first-event timeout waits for it at most
    /// the scope's close bound. By default, nothing to wait for: a drop
    /// releases everything.
    async fn open_released(&self) {}

    /// Who serves the model, as OpenTelemetry's GenAI conventions name it
    /// (`gen_ai.provider.name`: `openai`, `anthropic`, `aws.bedrock`, ...).
    fn name(&self) -> &str {
        "unknown"
    }
}
