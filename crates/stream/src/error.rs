//! The errors a provider stream can end with.

use std::time::Duration;

/// No event arrived for the idle timeout while the consumer was waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the provider sent no event for {idle:?} (idle timeout); \
     the stream was closed; raise the idle timeout if the model is slow to answer"
)]
pub struct IdleTimedOut {
    /// The idle timeout that ran out.
    pub idle: Duration,
}

/// The first event did not arrive within the first-event timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the provider sent no first event within {first:?} (first-event timeout); \
     the stream was closed; raise the first-event timeout if the model needs longer to start"
)]
pub struct FirstEventTimedOut {
    /// The first-event timeout that ran out.
    pub first: Duration,
}

/// Why a provider stream ended without completing.
///
/// Terminal: a stream yields at most one error, and it is closed before the
/// error reaches the consumer. One pointer wide (the [`StreamErrorKind`] is
/// boxed), so every item of a stream stays small on the hot path.
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct StreamError(Box<StreamErrorKind>);

impl StreamError {
    /// What went wrong.
    pub fn kind(&self) -> &StreamErrorKind {
        &self.0
    }

    /// What went wrong, by value.
    pub fn into_kind(self) -> StreamErrorKind {
        *self.0
    }

    /// The outcome a turn ending with this error has (SPEC §1, [`settle_core::Outcome`]).
    pub fn outcome(&self) -> settle_core::Outcome {
        use settle_core::Outcome;
        match self.kind() {
            StreamErrorKind::IdleTimeout(_) | StreamErrorKind::FirstEventTimeout(_) => {
                Outcome::IdleTimeout
            }
            StreamErrorKind::SelfCancelled => Outcome::Cancelled,
            _ => Outcome::Failed,
        }
    }
}

impl From<StreamErrorKind> for StreamError {
    fn from(kind: StreamErrorKind) -> Self {
        StreamError(Box::new(kind))
    }
}

impl From<IdleTimedOut> for StreamError {
    fn from(e: IdleTimedOut) -> Self {
        StreamErrorKind::IdleTimeout(e).into()
    }
}

impl From<FirstEventTimedOut> for StreamError {
    fn from(e: FirstEventTimedOut) -> Self {
        StreamErrorKind::FirstEventTimeout(e).into()
    }
}

/// The kinds of [`StreamError`].
#[derive(Debug, thiserror::Error)]
pub enum StreamErrorKind {
    /// The provider reported an error in the stream (an `error` object, a
    /// scripted failure).
    #[error("the provider reported an error: {message}")]
    Provider {
        /// The provider's own message.
        message: String,
    },
    /// No event within the idle timeout.
    #[error(transparent)]
    IdleTimeout(IdleTimedOut),
    /// No first event within the first-event timeout.
    #[error(transparent)]
    FirstEventTimeout(FirstEventTimedOut),
    /// The provider cancelled the turn itself (not a cancel request of ours).
    #[error("the provider cancelled the turn itself")]
    SelfCancelled,
    /// The request could not be sent or the response could not be read.
    #[error("could not talk to the provider at {url}: {source}; check the base URL and that the server is up")]
    Http {
        /// The URL the request went to.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The provider did not send response headers in time.
    #[error("the provider at {url} sent no response headers within {timeout:?}; raise the headers timeout or check the server")]
    HeadersTimeout {
        /// The URL the request went to.
        url: String,
        /// The headers timeout that ran out.
        timeout: Duration,
    },
    /// The provider answered with a non-success HTTP status.
    #[error("the provider at {url} answered HTTP {status}: {body}")]
    Status {
        /// The URL the request went to.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the response body, for the provider's explanation.
        body: String,
    },
    /// The provider sent something that is not a valid stream event.
    #[error("the provider sent a malformed event: {0}")]
    Protocol(String),
    /// A scripted provider was asked for more turns than its script has.
    #[error("the scripted provider has no turn left to play; add a turn to the script")]
    ScriptExhausted,
}

/// Why closing a stream did not succeed. Only ever logged, never propagated
/// past the best-effort closer (G4).
#[derive(Debug, thiserror::Error)]
pub enum CloseError {
    /// The stream can only be closed asynchronously; call `close().await`.
    #[error("this stream can only be closed asynchronously")]
    AsyncOnly,
    /// The provider failed to close the stream.
    #[error("the provider failed to close the stream: {0}")]
    Failed(String),
}
