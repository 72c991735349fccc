//! The errors a provider stream can end with, and how each one reads as a
//! turn's [`TurnError`] (issue: a failed turn always says why, SPEC §7).

use std::error::Error as _;
use std::fmt;
use std::time::Duration;

use settle_core::{Outcome, TurnError, TurnErrorKind};

/// No event arrived for the idle timeout while the consumer was waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the provider sent no content for {idle:?} (idle timeout), keepalives aside; \
     the turn ended and its stream is being closed; raise the idle timeout if the model is slow to answer"
)]
pub struct IdleTimedOut {
    /// The idle timeout that ran out.
    pub idle: Duration,
}

/// The first event did not arrive within the first-event timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "the provider sent no first event within {first:?} (first-event timeout, the idle timeout unless set); \
     the turn ended and its stream is being closed; raise the first-event timeout if the model needs longer to start"
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
///
/// Its message is what a person reads when a turn fails (`settle: reply
/// failed: …`); [`turn_error`](Self::turn_error) pairs it with the
/// [`TurnErrorKind`] that is stored with the turn.
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

    /// The outcome a turn ending with this error has (SPEC §1, [`Outcome`]).
    pub fn outcome(&self) -> Outcome {
        match self.kind() {
            StreamErrorKind::IdleTimeout(_) | StreamErrorKind::FirstEventTimeout(_) => {
                Outcome::IdleTimeout
            }
            StreamErrorKind::SelfCancelled => Outcome::Cancelled,
            _ => Outcome::Failed,
        }
    }

    /// The kind of turn error this is, as stored with the turn.
    pub fn error_kind(&self) -> TurnErrorKind {
        match self.kind() {
            StreamErrorKind::Provider { .. }
            | StreamErrorKind::SelfCancelled
            | StreamErrorKind::ScriptExhausted => TurnErrorKind::Provider,
            StreamErrorKind::IdleTimeout(_)
            | StreamErrorKind::FirstEventTimeout(_)
            | StreamErrorKind::HeadersTimeout { .. } => TurnErrorKind::Timeout,
            StreamErrorKind::InvalidUrl { .. }
            | StreamErrorKind::Connect { .. }
            | StreamErrorKind::Transport { .. } => TurnErrorKind::Connect,
            StreamErrorKind::Status { .. } => TurnErrorKind::HttpStatus,
            StreamErrorKind::Protocol(_) => TurnErrorKind::Protocol,
            StreamErrorKind::Truncated(_) => TurnErrorKind::Truncated,
        }
    }

    /// This error as a turn's error: its kind and its message.
    pub fn turn_error(&self) -> TurnError {
        TurnError::new(self.error_kind(), self.to_string())
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

impl From<&StreamError> for TurnError {
    fn from(error: &StreamError) -> Self {
        error.turn_error()
    }
}

/// The kinds of [`StreamError`]. Each message says what happened and where,
/// so a person can act on it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// The provider's address is not a URL a request can go to.
    #[error("`{url}` is not a valid provider URL ({reason}); give the base URL with its scheme, e.g. http://127.0.0.1:8080/v1")]
    InvalidUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The request could not reach the provider: refused, not resolved, TLS.
    #[error("could not connect to {url}: {}", Cause(source))]
    Connect {
        /// The URL the request went to.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The connection broke while the reply was being read.
    #[error("the connection to {url} broke during the reply: {}", Cause(source))]
    Transport {
        /// The URL the request went to.
        url: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// The provider did not send response headers in time.
    #[error("no response from {url} within {timeout:?} (the headers timeout); check the server, or raise the timeout for a slow one")]
    HeadersTimeout {
        /// The URL the request went to.
        url: String,
        /// The headers timeout that ran out.
        timeout: Duration,
    },
    /// The provider answered with a non-success HTTP status.
    #[error("HTTP {} from {url}{}", StatusLine(*status), Excerpt(body))]
    Status {
        /// The URL the request went to.
        url: String,
        /// The HTTP status code.
        status: u16,
        /// The start of the response body, for the provider's explanation.
        /// An OpenAI-compatible provider keeps it with its secrets masked;
        /// when the server wrote one that only decoding the body shows (a
        /// JSON escape), what the body says instead, decoded and masked.
        body: String,
        /// How long the server asked to wait before trying again
        /// (`Retry-After`, in seconds), when it said.
        retry_after: Option<Duration>,
    },
    /// The provider sent something that is not a valid stream event.
    #[error("the provider sent a malformed stream: {0}")]
    Protocol(String),
    /// The provider cut the reply short (G7: memory is never committed from
    /// a truncated transcript).
    #[error(transparent)]
    Truncated(Truncation),
    /// A scripted provider was asked for more turns than its script has.
    #[error("the scripted provider has no turn left to play; add a turn to the script")]
    ScriptExhausted,
}

/// Why the provider cut a reply short. The turn ends `failed` with
/// [`TurnErrorKind::Truncated`]: what was streamed is kept in the
/// transcript, but it is not the model's whole answer, so no memory is
/// committed from it (G7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum Truncation {
    /// The reply hit the token limit (`finish_reason: "length"`).
    #[error(
        "the reply was cut short at the token limit (finish_reason: length); the transcript \
         is truncated, so no memory is committed from it; raise the limit or shorten the request"
    )]
    Length,
    /// The provider's content filter withheld the rest of the reply
    /// (`finish_reason: "content_filter"`). Treated like a length cut: the
    /// reply stops mid-way for a reason outside the model's answer.
    #[error(
        "the provider's content filter stopped the reply (finish_reason: content_filter); the \
         transcript is incomplete, so no memory is committed from it"
    )]
    ContentFilter,
}

/// The innermost cause of a transport error, in words a person can act on.
struct Cause<'a>(&'a reqwest::Error);

impl fmt::Display for Cause<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut io = None;
        let mut innermost: &dyn std::error::Error = self.0;
        let mut next = self.0.source();
        while let Some(e) = next {
            if let Some(e) = e.downcast_ref::<std::io::Error>() {
                io.get_or_insert(e.kind());
            }
            innermost = e;
            next = e.source();
        }
        use std::io::ErrorKind;
        match io {
            Some(ErrorKind::ConnectionRefused) => {
                f.write_str("connection refused (is the server running?)")
            }
            Some(ErrorKind::ConnectionReset) => f.write_str("connection reset by the server"),
            Some(ErrorKind::ConnectionAborted) => f.write_str("connection aborted"),
            Some(ErrorKind::UnexpectedEof) => {
                f.write_str("the server closed the connection mid-reply")
            }
            Some(ErrorKind::TimedOut) => f.write_str("the connection timed out"),
            _ => write!(f, "{innermost}"),
        }
    }
}

/// `404 Not Found`, or the bare code when it has no standard reason.
struct StatusLine(u16);

impl fmt::Display for StatusLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = reqwest::StatusCode::from_u16(self.0)
            .ok()
            .and_then(|status| status.canonical_reason());
        match reason {
            Some(reason) => write!(f, "{} {reason}", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}

/// `: <what the body says>`, or nothing for an empty body.
struct Excerpt<'a>(&'a str);

/// How much of a body an error message quotes.
const EXCERPT_CHARS: usize = 200;

impl fmt::Display for Excerpt<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let excerpt = excerpt(self.0);
        if excerpt.is_empty() {
            return Ok(());
        }
        write!(f, ": {excerpt}")
    }
}

/// What an error response's body says, short: the message of a JSON error
/// (`{"error": {"message": …}}` and the usual variants), the title of an
/// HTML page, or the start of the text with its whitespace collapsed.
pub(crate) fn excerpt(body: &str) -> String {
    shorten(&said(body))
}

/// What an error response's body says, decoded, before it is shortened:
/// the message of a JSON error, the title of an HTML page, or the text
/// itself, its JSON escapes decoded when it looks like JSON that did not
/// parse (a body cut where it was read).
pub(crate) fn said(body: &str) -> String {
    let body = body.trim();
    json_message(body)
        .or_else(|| html_title(body))
        .unwrap_or_else(|| unescaped(body))
}

/// What a program or a server sent (an error's message, a body), as an
/// error quotes it: on one line, its control characters escaped
/// (`\u{1b}`), at most 200 characters (an ellipsis last). For text from
/// elsewhere that a turn's error carries, as the OpenAI provider quotes
/// its server's.
///
/// ```
/// assert_eq!(settle_stream::quote("bad\n\u{1b}[31mnews"), "bad \\u{1b}[31mnews");
/// assert_eq!(settle_stream::quote(&"x".repeat(500)).chars().count(), 200);
/// // A bidirectional override would make the rest read backwards.
/// assert_eq!(settle_stream::quote("evil\u{202e}txt.exe"), "evil\\u{202e}txt.exe");
/// ```
pub fn quote(text: &str) -> String {
    shorten(text)
}

/// `text` with its whitespace collapsed and its other control characters,
/// and the characters that reorder or hide text ([`hides`](crate::hides)),
/// escaped (`\u{1b}`, `\u{202e}`: what a server sent is told on one line,
/// never obeyed by a terminal), cut to [`EXCERPT_CHARS`] characters (an
/// ellipsis last) when longer; shortening it again changes nothing.
pub(crate) fn shorten(text: &str) -> String {
    let collapsed = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .chars()
        .flat_map(|c| match crate::hides(c) {
            true => c.escape_unicode().collect::<Vec<_>>(),
            false => vec![c],
        })
        .collect::<String>();
    if collapsed.chars().count() <= EXCERPT_CHARS {
        return collapsed;
    }
    let mut short: String = collapsed.chars().take(EXCERPT_CHARS - 1).collect();
    short.push('…');
    short
}

/// `text` with the escapes of JSON strings decoded (`\u0042`, `\"`,
/// `\n`, …), leniently: an escape it cannot read is kept as it is, a lone
/// surrogate becomes U+FFFD. Only for text that looks like JSON or has
/// `\u` escapes; any other text is kept as it is.
fn unescaped(text: &str) -> String {
    let looks_like_json = text.starts_with('{') || text.starts_with('[') || text.contains("\\u");
    if !looks_like_json || !text.contains('\\') {
        return text.to_owned();
    }
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find('\\') {
        out.push_str(&rest[..at]);
        let escape = &rest[at..];
        let (decoded, used) = match escape.as_bytes().get(1) {
            Some(b'"') => ('"', 2),
            Some(b'\\') => ('\\', 2),
            Some(b'/') => ('/', 2),
            Some(b'b') => ('\u{8}', 2),
            Some(b'f') => ('\u{c}', 2),
            Some(b'n') => ('\n', 2),
            Some(b'r') => ('\r', 2),
            Some(b't') => ('\t', 2),
            Some(b'u') => unicode_escape(escape).unwrap_or(('\\', 1)),
            _ => ('\\', 1),
        };
        out.push(decoded);
        rest = &escape[used..];
    }
    out.push_str(rest);
    out
}

/// The character a `\uXXXX` escape at the start of `escape` names (a
/// surrogate pair's two escapes together), and how many bytes it took.
fn unicode_escape(escape: &str) -> Option<(char, usize)> {
    let unit = |at: usize| -> Option<u32> {
        let hex = escape.get(at + 2..at + 6)?;
        (escape.get(at..at + 2)? == "\\u")
            .then(|| u32::from_str_radix(hex, 16).ok())
            .flatten()
    };
    let first = unit(0)?;
    if (0xD800..0xDC00).contains(&first) {
        if let Some(second) = unit(6).filter(|s| (0xDC00..0xE000).contains(s)) {
            let code = 0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00);
            return Some((char::from_u32(code).unwrap_or('\u{fffd}'), 12));
        }
    }
    Some((char::from_u32(first).unwrap_or('\u{fffd}'), 6))
}

fn json_message(body: &str) -> Option<String> {
    let value: serde_json::Value = serde_json::from_str(body).ok()?;
    let candidates = [
        value.pointer("/error/message"),
        value.get("error"),
        value.get("message"),
        value.get("detail"),
    ];
    let message = candidates
        .into_iter()
        .flatten()
        .find_map(|v| v.as_str().map(str::to_owned));
    message
}

fn html_title(body: &str) -> Option<String> {
    let lower = body.to_ascii_lowercase();
    let start = lower.find("<title>")? + "<title>".len();
    let end = start + lower[start..].find("</title>")?;
    body.get(start..end).map(str::to_owned)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_excerpt_says_what_the_body_says_briefly() {
        assert_eq!(
            excerpt(r#"{"error":{"message":"model not found","type":"invalid_request_error"}}"#),
            "model not found"
        );
        assert_eq!(excerpt(r#"{"error":"bad key"}"#), "bad key");
        assert_eq!(excerpt(r#"{"detail":"Not Found"}"#), "Not Found");
        assert_eq!(
            excerpt("<html><head><title>502 Bad Gateway</title></head><body>…</body></html>"),
            "502 Bad Gateway"
        );
        assert_eq!(excerpt("  no\n  such\tmodel \n"), "no such model");
        assert_eq!(excerpt(""), "");
        let long = "x".repeat(1000);
        assert_eq!(excerpt(&long).chars().count(), EXCERPT_CHARS);
        assert_eq!(excerpt(&excerpt(&long)), excerpt(&long));
    }

    #[test]
    fn a_body_that_looks_like_json_but_does_not_parse_is_quoted_with_its_escapes_decoded() {
        assert_eq!(
            excerpt(r#"{"error":{"message":"bad key: \u0042e\"q\\ \ud83d\ude00 \uZZ \"#),
            "{\"error\":{\"message\":\"bad key: Be\"q\\ \u{1f600} \\uZZ \\"
        );
        // Escapes decoded throughout once the text has a `\u` one.
        assert_eq!(excerpt(r"C:\new \u0041"), "C: ew A");
        assert_eq!(excerpt(r"C:\new"), r"C:\new");
    }

    #[test]
    fn a_status_error_reads_as_its_status_line_and_excerpt() {
        let error = StreamError::from(StreamErrorKind::Status {
            url: "http://h/v1/chat/completions".into(),
            status: 404,
            body: String::new(),
            retry_after: None,
        });
        assert_eq!(
            error.to_string(),
            "HTTP 404 Not Found from http://h/v1/chat/completions"
        );
        assert_eq!(error.error_kind(), TurnErrorKind::HttpStatus);
        let error = StreamError::from(StreamErrorKind::Status {
            url: "http://h/x".into(),
            status: 599,
            body: "{\"message\":\"busy\"}".into(),
            retry_after: None,
        });
        assert_eq!(error.to_string(), "HTTP 599 from http://h/x: busy");
        assert_eq!(error.outcome(), Outcome::Failed);
    }

    #[test]
    fn every_kind_maps_to_a_turn_error_kind() {
        let cases: [(StreamError, TurnErrorKind, Outcome); 6] = [
            (
                IdleTimedOut {
                    idle: Duration::from_secs(5),
                }
                .into(),
                TurnErrorKind::Timeout,
                Outcome::IdleTimeout,
            ),
            (
                FirstEventTimedOut {
                    first: Duration::from_secs(5),
                }
                .into(),
                TurnErrorKind::Timeout,
                Outcome::IdleTimeout,
            ),
            (
                StreamErrorKind::Truncated(Truncation::Length).into(),
                TurnErrorKind::Truncated,
                Outcome::Failed,
            ),
            (
                StreamErrorKind::Protocol("x".into()).into(),
                TurnErrorKind::Protocol,
                Outcome::Failed,
            ),
            (
                StreamErrorKind::Provider {
                    message: "x".into(),
                }
                .into(),
                TurnErrorKind::Provider,
                Outcome::Failed,
            ),
            (
                StreamErrorKind::SelfCancelled.into(),
                TurnErrorKind::Provider,
                Outcome::Cancelled,
            ),
        ];
        for (error, kind, outcome) in cases {
            let turn = error.turn_error();
            assert_eq!(turn.kind, kind, "{error}");
            assert_eq!(turn.message, error.to_string());
            assert_eq!(error.outcome(), outcome, "{error}");
        }
        let idle: StreamError = IdleTimedOut {
            idle: Duration::from_secs(5),
        }
        .into();
        assert!(idle.to_string().contains("idle timeout"), "{idle}");
        let truncated: StreamError = StreamErrorKind::Truncated(Truncation::Length).into();
        assert!(truncated.to_string().contains("truncated"), "{truncated}");
    }
}
