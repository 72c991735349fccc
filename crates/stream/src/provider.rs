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

    /// Who serves the model, as OpenTelemetry's GenAI conventions name it
    /// (`gen_ai.provider.name`: `openai`, `anthropic`, `aws.bedrock`, ...).
    fn name(&self) -> &str {
        "unknown"
    }
}
