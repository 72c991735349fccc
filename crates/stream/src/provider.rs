//! The [`Provider`] trait: what turns a request into a closable stream of
//! events.

use async_trait::async_trait;
use futures_util::Stream;

use crate::close::Close;
use crate::{StreamError, StreamEvent};

/// Who wrote a message of the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Instructions for the model.
    System,
    /// The person (or the agent's caller).
    User,
    /// The model.
    Assistant,
}

impl Role {
    /// The spelling chat-completion APIs use.
    pub const fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// One message of the conversation sent to the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// Who wrote it.
    pub role: Role,
    /// What it says.
    pub content: String,
}

impl Message {
    /// A message from `role`.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
        }
    }
}

/// What a turn asks the model: the conversation so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Request {
    /// The messages, oldest first.
    pub messages: Vec<Message>,
}

impl Request {
    /// A request of the given messages.
    pub fn new(messages: Vec<Message>) -> Self {
        Request { messages }
    }

    /// A request of one user message.
    pub fn prompt(text: impl Into<String>) -> Self {
        Request {
            messages: vec![Message::new(Role::User, text)],
        }
    }
}

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
/// must not read events, so a stream is attached to its turn's scope before
/// it produces anything. If the future is dropped (the turn was cancelled
/// while it was opening), whatever it had opened must be released by drop;
/// wrap it in [`Guarded`](crate::Guarded) as soon as it exists to have it
/// closed too.
#[async_trait]
pub trait Provider: Send + Sync {
    /// Opens the stream of one turn.
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError>;
}
