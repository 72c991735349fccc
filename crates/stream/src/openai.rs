//! A provider for OpenAI-compatible chat-completion servers, streamed over
//! server-sent events.

use std::collections::VecDeque;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use futures_util::{Stream, StreamExt};
use serde::Serialize;
use serde_json::Value;

use crate::close::Close;
use crate::secrets::{shown_url, Secrets};
use crate::split_surrogates::{Refused, SplitSurrogates};
use crate::sse::SseDecoder;
use crate::{
    CloseError, Message, OpenAiChunks, Provider, ProviderStream, Request, StreamError,
    StreamErrorKind, StreamEvent,
};

/// The default time to wait for a server's response headers.
pub const DEFAULT_HEADERS_TIMEOUT: Duration = Duration::from_secs(30);

/// The default maximum size of one server-sent event, in bytes: its lines
/// as sent, field names included. A chat-completion event is a few hundred
/// bytes; 4 MiB leaves room for a whole reply sent as one event while
/// bounding what a hostile or broken server can make a turn hold.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 4 * 1024 * 1024;

/// How much of an error response's body is kept for the error message.
const ERROR_BODY_LIMIT: usize = 2048;

/// How long an error response's body is waited for, at most (see
/// [`error_body_wait`]).
const ERROR_BODY_WAIT: Duration = Duration::from_secs(5);

/// Reads the start of a response body into `head`, at most
/// [`ERROR_BODY_LIMIT`] bytes.
async fn read_head(mut response: reqwest::Response, head: &mut Vec<u8>) {
    while head.len() < ERROR_BODY_LIMIT {
        match response.chunk().await {
            Ok(Some(bytes)) => head.extend_from_slice(&bytes),
            Ok(None) | Err(_) => break,
        }
    }
    head.truncate(ERROR_BODY_LIMIT);
}

/// What a redirect's error says: where it pointed (its password and query
/// values masked, and whatever else of it is a secret of `secrets`), and
/// that it is not followed.
fn redirected(headers: &reqwest::header::HeaderMap, secrets: &Secrets) -> String {
    let location = headers
        .get(reqwest::header::LOCATION)
        .and_then(|l| l.to_str().ok());
    match location {
        Some(to) => format!(
            "redirected to {} (not followed: set the base URL to where the server is)",
            secrets.scrub(&shown_url(to))
        ),
        None => "a redirect without a location (not followed)".to_owned(),
    }
}

/// Where and how to reach an OpenAI-compatible server.
#[derive(Clone, PartialEq, Eq)]
pub struct OpenAiConfig {
    /// The API base, e.g. `http://127.0.0.1:8080/v1`; `/chat/completions` is
    /// appended to its path (a query it has stays after it). Errors and
    /// `Debug` name it without its password and query values, and the start
    /// of an error body the server sends back is shown with every secret of
    /// the config masked.
    pub base_url: String,
    /// The model name sent with each request.
    pub model: String,
    /// Sent as a bearer token when set.
    pub api_key: Option<String>,
    /// How long to wait for the response headers; zero disables.
    pub headers_timeout: Duration,
    /// The largest server-sent event accepted, in bytes (default
    /// [`DEFAULT_MAX_EVENT_BYTES`]); a larger one fails the turn with a
    /// [`Protocol`](StreamErrorKind::Protocol) error.
    pub max_event_bytes: usize,
    /// Asks the server to end the stream with a usage report
    /// (`stream_options.include_usage`), which becomes a
    /// [`ChunkKind::Usage`](crate::ChunkKind::Usage) chunk: what token budgets and metrics count.
    /// Default `true`; turn it off for a server that refuses the field.
    pub include_usage: bool,
    /// Extra headers sent with every request (an organization, a project,
    /// a gateway's routing key, `api-key` for Azure). Their values are
    /// never shown by `Debug` nor in an error.
    pub headers: Vec<(String, String)>,
    /// Extra query parameters of every request (`api-version` for Azure).
    /// Like the base URL's own query values, their values are never shown by
    /// `Debug` nor in an error.
    pub query: Vec<(String, String)>,
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("base_url", &shown_url(&self.base_url))
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("headers_timeout", &self.headers_timeout)
            .field("max_event_bytes", &self.max_event_bytes)
            .field("include_usage", &self.include_usage)
            .field(
                "headers",
                &self
                    .headers
                    .iter()
                    .map(|(name, _)| name)
                    .collect::<Vec<_>>(),
            )
            .field(
                "query",
                &self.query.iter().map(|(name, _)| name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl OpenAiConfig {
    /// A config for `model` at `base_url`, without an API key.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        OpenAiConfig {
            base_url: base_url.into(),
            model: model.into(),
            api_key: None,
            headers_timeout: DEFAULT_HEADERS_TIMEOUT,
            max_event_bytes: DEFAULT_MAX_EVENT_BYTES,
            include_usage: true,
            headers: Vec::new(),
            query: Vec::new(),
        }
    }

    /// Sets whether to ask for a usage report at the end of the stream.
    pub fn include_usage(mut self, include: bool) -> Self {
        self.include_usage = include;
        self
    }

    /// Adds a header sent with every request.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }

    /// Adds a query parameter sent with every request.
    pub fn query(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.query.push((name.into(), value.into()));
        self
    }

    /// Sets the API key.
    pub fn api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// Sets the headers timeout.
    pub fn headers_timeout(mut self, timeout: Duration) -> Self {
        self.headers_timeout = timeout;
        self
    }

    /// Sets the largest server-sent event accepted, in bytes.
    pub fn max_event_bytes(mut self, max: usize) -> Self {
        self.max_event_bytes = max;
        self
    }
}

/// Streams chat completions from an OpenAI-compatible server:
/// `POST {base_url}/chat/completions` with `stream: true`.
///
/// What the server sends becomes [`Chunk`](crate::Chunk)s:
///
/// | server sends (`choices[0]`, or top level) | chunk |
/// |---|---|
/// | `delta.content` | [`ChunkKind::Text`](crate::ChunkKind::Text) |
/// | `delta.reasoning_content` or `delta.reasoning` | [`ChunkKind::Reasoning`](crate::ChunkKind::Reasoning) (the JSON value, usually a string) |
/// | each element of `delta.tool_calls` | [`ChunkKind::ToolCall`](crate::ChunkKind::ToolCall) (the element as sent: index, id, function name, a piece of the arguments) |
/// | a `usage` object | [`ChunkKind::Usage`](crate::ChunkKind::Usage) |
///
/// A `finish_reason` is [`StreamEvent::Finished`] after the event's own
/// content. One of `length` or `content_filter` ends the stream with
/// [`StreamErrorKind::Truncated`] once the usage the server sends after it
/// is read: the turn ends `failed` (kind `truncated`), never `completed`,
/// so no memory is committed from a reply the provider cut short (G7).
/// The reading is [`OpenAiChunks`]'s, which a custom path reuses.
///
/// `data: [DONE]` ends the stream; an `error` object (not `null`) is a provider error; SSE
/// comments (`: keepalive`) and events without content (a role announcement)
/// become [`StreamEvent::KeepAlive`]; a stream the server ends without
/// `[DONE]` is a protocol error, since the reply may be cut short. Closing
/// the stream drops the response body, which closes the connection.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    config: OpenAiConfig,
    url: reqwest::Url,
    /// `url` as messages name it: no password, no query value.
    shown: String,
    secrets: Secrets,
    client: reqwest::Client,
}

impl OpenAiProvider {
    /// A provider for `config`, with a client of its own.
    pub fn new(config: OpenAiConfig) -> Result<Self, StreamError> {
        let url = Self::checked_url(&config)?;
        // A redirect is not followed: a streaming POST re-sent elsewhere
        // carries the conversation to another host, and one turned into a
        // GET streams whatever that URL says. It fails with its status.
        let client = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|source| {
                StreamError::from(StreamErrorKind::Connect {
                    url: shown_url(url.as_str()),
                    source: source.without_url(),
                })
            })?;
        Ok(Self::with_url(config, url, client))
    }

    /// A provider for `config` that sends through `client`: one connection
    /// pool, proxy, TLS and timeout setup shared with the rest of a program
    /// (a `reqwest::Client` is a handle; cloning it shares the pool). Its
    /// redirect policy is the client's own: [`new`](Self::new) follows
    /// none, and a redirect the client does not follow fails the turn with
    /// its status and where it pointed.
    pub fn with_client(config: OpenAiConfig, client: reqwest::Client) -> Result<Self, StreamError> {
        let url = Self::checked_url(&config)?;
        Ok(Self::with_url(config, url, client))
    }

    fn with_url(config: OpenAiConfig, url: reqwest::Url, client: reqwest::Client) -> Self {
        OpenAiProvider {
            shown: shown_url(url.as_str()),
            secrets: Secrets::of(&config),
            config,
            url,
            client,
        }
    }

    /// The base URL with `chat/completions` appended to its path; its query,
    /// if it has one, kept after it.
    fn checked_url(config: &OpenAiConfig) -> Result<reqwest::Url, StreamError> {
        let invalid = |reason: String| {
            StreamError::from(StreamErrorKind::InvalidUrl {
                url: shown_url(&config.base_url),
                reason,
            })
        };
        let mut url = reqwest::Url::parse(&config.base_url).map_err(|e| invalid(e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid(format!(
                "the scheme `{}` is not http or https",
                url.scheme()
            )));
        }
        match url.path_segments_mut() {
            Ok(mut path) => {
                path.pop_if_empty().extend(["chat", "completions"]);
            }
            Err(()) => return Err(invalid("it cannot have a path".to_owned())),
        }
        // The client would send both: the URL's as `Basic`, the key as
        // `Bearer`, and the server would take either.
        if config.api_key.is_some() && (!url.username().is_empty() || url.password().is_some()) {
            return Err(invalid(
                "it carries credentials (user:password@) and an API key is given too; give one"
                    .to_owned(),
            ));
        }
        Ok(url)
    }

    /// The config it sends with.
    pub fn config(&self) -> &OpenAiConfig {
        &self.config
    }

    /// The URL requests go to.
    pub fn url(&self) -> &str {
        self.url.as_str()
    }

    async fn send(&self, request: &Request) -> Result<reqwest::Response, StreamError> {
        let body = Body {
            extra: Extra(&request.options.extra),
            model: &self.config.model,
            messages: &request.messages,
            stream: true,
            stream_options: self.config.include_usage.then_some(StreamOptions {
                include_usage: true,
            }),
            tools: request.options.tools.as_ref(),
            tool_choice: request.options.tool_choice.as_ref(),
            response_format: request.options.response_format.as_ref(),
            temperature: request.options.temperature,
            max_tokens: request.options.max_tokens,
        };
        let mut builder = self.client.post(self.url.clone()).json(&body);
        if !self.config.query.is_empty() {
            builder = builder.query(&self.config.query);
        }
        for (name, value) in &self.config.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        if let Some(key) = &self.config.api_key {
            builder = builder.bearer_auth(key);
        }
        let http = |source: reqwest::Error| {
            StreamError::from(StreamErrorKind::Connect {
                url: self.shown.clone(),
                source: source.without_url(),
            })
        };
        let timeout = self.config.headers_timeout;
        if timeout.is_zero() {
            return builder.send().await.map_err(http);
        }
        match tokio::time::timeout(timeout, builder.send()).await {
            Ok(response) => response.map_err(http),
            Err(_) => Err(StreamErrorKind::HeadersTimeout {
                url: self.shown.clone(),
                timeout,
            }
            .into()),
        }
    }
}

#[async_trait]
impl Provider for OpenAiProvider {
    async fn open(&self, request: &Request) -> Result<ProviderStream, StreamError> {
        self.open_by(request, None).await
    }

    async fn open_by(
        &self,
        request: &Request,
        due: Option<tokio::time::Instant>,
    ) -> Result<ProviderStream, StreamError> {
        let response = self.send(request).await?;
        let status = response.status();
        if !status.is_success() {
            // The body explains the status, but a stalled server must not
            // hold the turn: read its start, within a short while.
            let retry_after = retry_after(response.headers());
            if status.is_redirection() {
                return Err(StreamErrorKind::Status {
                    url: self.shown.clone(),
                    status: status.as_u16(),
                    body: redirected(response.headers(), &self.secrets),
                    retry_after,
                }
                .into());
            }
            let mut head = Vec::new();
            let _ =
                tokio::time::timeout(error_body_wait(due), read_head(response, &mut head)).await;
            // Read to the limit: there may be more, a secret cut in two.
            let cut = head.len() >= ERROR_BODY_LIMIT;
            return Err(StreamErrorKind::Status {
                url: self.shown.clone(),
                status: status.as_u16(),
                body: self.secrets.kept(&String::from_utf8_lossy(&head), cut),
                retry_after,
            }
            .into());
        }
        Ok(Box::new(
            OpenAiStream::from_response(response, self.config.max_event_bytes)
                .scrubbing(self.secrets.clone()),
        ))
    }

    fn name(&self) -> &str {
        "openai"
    }
}

/// How long the start of an error body may take: [`ERROR_BODY_WAIT`], or
/// half of what is left until `due`, when the turn's first event is due
/// sooner (the refusal is then told before the deadline, as itself).
fn error_body_wait(due: Option<tokio::time::Instant>) -> Duration {
    match due {
        Some(due) => {
            ERROR_BODY_WAIT.min(due.saturating_duration_since(tokio::time::Instant::now()) / 2)
        }
        None => ERROR_BODY_WAIT,
    }
}

/// The `Retry-After` of a response: its delay in seconds, or the time until
/// the HTTP date it gives (none for a date past); `None` for what is
/// neither (the backoff applies then).
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    let then = httpdate::parse_http_date(value).ok()?;
    Some(
        then.duration_since(std::time::SystemTime::now())
            .unwrap_or(Duration::ZERO),
    )
}

/// The request body. A [`Message`] serializes to the chat-completion shape
/// itself: role, content, and the tool fields when it has them.
///
/// The options' `extra` fields come first and are overridden by the named
/// ones: JSON objects keep the last of two equal keys, and the provider's own
/// `model`, `messages` and `stream` are not the caller's to replace.
#[derive(Serialize)]
struct Body<'a> {
    #[serde(flatten)]
    extra: Extra<'a>,
    model: &'a str,
    messages: &'a [Message],
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<StreamOptions>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u32>,
}

#[derive(Serialize)]
struct StreamOptions {
    include_usage: bool,
}

/// The extra body fields, less those the body sets itself.
struct Extra<'a>(&'a serde_json::Map<String, Value>);

impl Serialize for Extra<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        const OWN: [&str; 9] = [
            "model",
            "messages",
            "stream",
            "stream_options",
            "tools",
            "tool_choice",
            "response_format",
            "temperature",
            "max_tokens",
        ];
        let mut map = serializer.serialize_map(None)?;
        for (name, value) in self.0 {
            if !OWN.contains(&name.as_str()) {
                map.serialize_entry(name, value)?;
            }
        }
        map.end()
    }
}

type ResponseBody = Pin<Box<dyn Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Send>>;

/// The event stream of one chat completion.
///
/// Each `data:` event is read as [`OpenAiChunks`] says. A character a
/// server split across two events (the halves of a UTF-16 surrogate pair,
/// `"\ud83d"` ending one event's string and `"\ude00"` starting the next
/// one's in the same place) is joined; half a character nothing completes
/// fails the reply with a protocol error, as any lone surrogate.
pub struct OpenAiStream {
    // `None` once closed: dropping it drops the response body and with it
    // the connection.
    body: Option<ResponseBody>,
    decoder: SseDecoder,
    // The decoded items of the last event not yet yielded: one SSE event can
    // carry reasoning, text, tool calls and usage at once.
    pending: VecDeque<Result<StreamEvent, StreamError>>,
    // The comments (keepalives) of the decoder already reported.
    keepalives_seen: usize,
    url: String,
    /// What its errors are scrubbed of: a server may echo the request's
    /// secrets inside the stream (an `error` event, a malformed line).
    secrets: Secrets,
    /// The response's `Content-Type` when it is not an event stream, for
    /// the error of a body that holds no event.
    not_events: Option<String>,
    /// Whether any `data:` event was decoded.
    had_event: bool,
    /// What the reply's chunks said so far (a cut, told at the end).
    chunks: OpenAiChunks,
    /// The high halves of characters split across events, waiting.
    split: SplitSurrogates,
    /// The body's failure (not SSE), told once the events it completed
    /// before the failing line are yielded.
    failed: Option<StreamError>,
}

impl fmt::Debug for OpenAiStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiStream")
            .field("url", &self.url)
            .field("open", &self.body.is_some())
            .finish_non_exhaustive()
    }
}

impl OpenAiStream {
    /// The event stream of `response`, a chat completion's streamed reply:
    /// for a custom provider that sends its own request (another endpoint,
    /// a signed request, a different body) and reads an OpenAI-shaped event
    /// stream back. Events larger than `max_event_bytes` fail the stream.
    /// The response's status is not checked here.
    pub fn from_response(response: reqwest::Response, max_event_bytes: usize) -> Self {
        let url = response.url().to_string();
        let content_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|t| t.to_str().ok())
            .map(str::to_owned);
        let mut stream = Self::from_body(response.bytes_stream(), url, max_event_bytes);
        stream.not_events = content_type.filter(|t| {
            !t.trim_start()
                .to_ascii_lowercase()
                .starts_with("text/event-stream")
        });
        stream
    }

    /// The event stream of a body read some other way: its pieces as they
    /// arrive, and the URL its errors name (without its password and query
    /// values).
    pub fn from_body<B>(body: B, url: impl Into<String>, max_event_bytes: usize) -> Self
    where
        B: Stream<Item = Result<bytes::Bytes, reqwest::Error>> + Send + 'static,
    {
        OpenAiStream {
            body: Some(Box::pin(body)),
            decoder: SseDecoder::new(max_event_bytes),
            pending: VecDeque::new(),
            keepalives_seen: 0,
            url: shown_url(&url.into()),
            secrets: Secrets::default(),
            not_events: None,
            had_event: false,
            chunks: OpenAiChunks::default(),
            split: SplitSurrogates::default(),
            failed: None,
        }
    }

    /// The same stream, its errors scrubbed of `secrets` (the provider's).
    pub(crate) fn scrubbing(mut self, secrets: Secrets) -> Self {
        self.secrets = secrets;
        self
    }

    /// Decodes one SSE event into `pending`: its chunks in order, or one
    /// error. Returns `false` at `data: [DONE]`, the end of the reply.
    fn decode(&mut self, data: &str) -> bool {
        let data = data.trim();
        if data == "[DONE]" {
            return false;
        }
        let value: Value = match self.split.parse(data) {
            Ok(value) => value,
            Err(refused) => {
                let what = match refused {
                    Refused::NotJson(e) => format!("is not JSON ({e})"),
                    Refused::Lone(words) => format!("cannot be stored: {words}"),
                };
                self.pending
                    .push_back(Err(StreamErrorKind::Protocol(format!(
                        "an event from {} {what}: {}",
                        self.url,
                        self.secrets.shown(data, false)
                    ))
                    .into()));
                return true;
            }
        };
        let secrets = &self.secrets;
        // Told on one line, its control characters escaped, no secret.
        let quote = |message: &str| secrets.shown(message, false);
        self.pending.extend(self.chunks.read(&value, &quote));
        true
    }
}

impl OpenAiStream {
    /// At the reply's end: the error it ends with, if any: half a
    /// character nothing completed, else a cut a finish reason said.
    fn end(&mut self) -> Option<StreamError> {
        if let Some(words) = self.split.left() {
            return Some(
                StreamErrorKind::Protocol(format!(
                    "the reply from {} cannot be stored: {words}",
                    self.url
                ))
                .into(),
            );
        }
        self.chunks.end()
    }
}

impl Stream for OpenAiStream {
    type Item = Result<StreamEvent, StreamError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if let Some(item) = this.pending.pop_front() {
                if item.is_err() {
                    // An error ends the stream: nothing after it is read.
                    this.pending.clear();
                    this.body = None;
                }
                return Poll::Ready(Some(item));
            }
            let Some(body) = this.body.as_mut() else {
                return Poll::Ready(None);
            };
            if let Some(data) = this.decoder.next_event() {
                this.had_event = true;
                if !this.decode(&data) {
                    this.body = None;
                    return Poll::Ready(this.end().map(Err));
                }
                continue;
            }
            if let Some(error) = this.failed.take() {
                this.pending.push_back(Err(error));
                continue;
            }
            let error: StreamError = match body.poll_next_unpin(cx) {
                Poll::Ready(Some(Ok(bytes))) => match this.decoder.feed(&bytes) {
                    Ok(()) => continue,
                    // The events of this read before the failing line
                    // come first, however the server's writes were split.
                    Err(e) => {
                        this.failed = Some(
                            StreamErrorKind::Protocol(format!(
                                "the stream from {} is not valid SSE: {e}",
                                this.url
                            ))
                            .into(),
                        );
                        continue;
                    }
                },
                Poll::Ready(Some(Err(source))) => StreamErrorKind::Transport {
                    url: this.url.clone(),
                    source: source.without_url(),
                }
                .into(),
                // Said done by a finish reason, whole or cut: a close
                // without `[DONE]` ends it as that said.
                Poll::Ready(None) if this.chunks.is_finished() => {
                    this.body = None;
                    return Poll::Ready(this.end().map(Err));
                }
                Poll::Ready(None) => match this.not_events.as_deref().filter(|_| !this.had_event) {
                    // A whole answer that is not a stream (a chat completion
                    // without `stream: true`, an HTML page): said as such.
                    Some(content_type) => StreamErrorKind::Protocol(format!(
                        "the server at {} answered with `{}`, not an event stream, \
                         and no event: is it an OpenAI-compatible streaming endpoint?",
                        this.url,
                        // A server may echo a secret in any header.
                        this.secrets.shown(content_type, false)
                    )),
                    None => StreamErrorKind::Protocol(format!(
                        "the stream from {} ended before `data: [DONE]`; the reply may be cut short",
                        this.url
                    )),
                }
                .into(),
                Poll::Pending => {
                    // Comments are activity: one keepalive for those decoded
                    // since the last, once the body has nothing more ready.
                    let comments = this.decoder.comments();
                    if comments == this.keepalives_seen {
                        return Poll::Pending;
                    }
                    this.keepalives_seen = comments;
                    return Poll::Ready(Some(Ok(StreamEvent::KeepAlive)));
                }
            };
            this.pending.push_back(Err(error));
        }
    }
}

#[async_trait]
impl Close for OpenAiStream {
    fn close_waits(&self) -> bool {
        false
    }

    fn close_now(&mut self) -> Result<(), CloseError> {
        self.body = None;
        Ok(())
    }
}
