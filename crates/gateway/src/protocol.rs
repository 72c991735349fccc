//! The wire format: JSON-RPC 2.0, one message per WebSocket text frame.
//!
//! A request is an object `{"jsonrpc": "2.0", "id": ..., "method": ...,
//! "params": {...}}`; one without an `id` is a notification, carried out
//! with no answer. An `id` is a string or an integer within 64 bits, and
//! its answer echoes it exactly; any other, null included, is refused.
//! Params go by name, as an object (or are left out when a method needs
//! none). A batch (an array) is refused: the protocol is one message per
//! frame, so that a reply is never held back behind others.
//!
//! Every error carries a stable `data.kind` (see [`ErrorKind`]) besides the
//! JSON-RPC code: a client decides on the kind, a person reads the message.

use std::borrow::Cow;

use serde_json::{json, Map, Value};
use settle_core::Error as CoreError;
use settle_core::State;
use settle_runtime::RuntimeError;
use settle_store::StoreError;

use crate::excerpt::bounded_message;

/// The stable kind of an error, in its `data.kind` (SPEC §10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The session is finalized: it takes no more turns, holds or transports.
    SessionClosed,
    /// No session has this id.
    NotFound,
    /// The session cannot do that now (a turn is already in flight, it is
    /// closing, its parent cannot take children).
    WrongState,
    /// The gateway is shutting down: it starts no session or turn, and ends every session itself.
    ShuttingDown,
    /// The message is not a request the gateway understands: malformed JSON,
    /// not JSON-RPC 2.0, an unknown method, missing or wrong params.
    BadRequest,
    /// The gateway could not do it for a reason of its own: the session
    /// store failed or did not answer in time. Nothing was acknowledged.
    Internal,
    /// A limit refuses it: the principal has its maximum of live sessions
    /// (or holds), or the session cap (`--max-sessions`) is full of
    /// sessions none of which can be evicted. Nothing was written.
    OverCapacity,
    /// The connection sends requests faster than its rate: this one was not
    /// carried out; send it again a little later.
    RateLimited,
    /// A size limit refuses it: a prompt, or the history sent with it, is
    /// larger than the gateway takes (nothing was written); in a
    /// `turn.ended`, the turn streamed more chunks or bytes than a turn may
    /// and was cancelled.
    TooLarge,
    /// Another process of the fleet owns the session (SPEC §12): reconnect
    /// to `data.owner`, its URL, and attach there; `data.owner` null: it was
    /// handed off and nobody owns it now, and `session.attach` adopts it.
    Elsewhere,
    /// The session is live in the store, and no process of this gateway
    /// serves it: the process that ran it stopped without ending it (a
    /// crash, a lost lease), or another program on the database runs it.
    /// `session.read` reads it; recovery (`settle recover`) ends it once
    /// that process is gone (G8).
    LeftForRecovery,
}

impl ErrorKind {
    /// Every kind.
    pub const ALL: &'static [ErrorKind] = &[
        ErrorKind::SessionClosed,
        ErrorKind::NotFound,
        ErrorKind::WrongState,
        ErrorKind::ShuttingDown,
        ErrorKind::BadRequest,
        ErrorKind::Internal,
        ErrorKind::OverCapacity,
        ErrorKind::RateLimited,
        ErrorKind::TooLarge,
        ErrorKind::Elsewhere,
        ErrorKind::LeftForRecovery,
    ];

    /// The spelling in `data.kind`.
    pub const fn as_str(self) -> &'static str {
        match self {
            ErrorKind::SessionClosed => "session_closed",
            ErrorKind::NotFound => "not_found",
            ErrorKind::WrongState => "wrong_state",
            ErrorKind::ShuttingDown => "shutting_down",
            ErrorKind::BadRequest => "bad_request",
            ErrorKind::Internal => "internal",
            ErrorKind::OverCapacity => "over_capacity",
            ErrorKind::RateLimited => "rate_limited",
            ErrorKind::TooLarge => "too_large",
            ErrorKind::Elsewhere => "elsewhere",
            ErrorKind::LeftForRecovery => "left_for_recovery",
        }
    }
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// JSON-RPC's own codes, and the server codes of the kinds that have none.
pub(crate) mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL: i64 = -32603;
    pub const NOT_FOUND: i64 = -32001;
    pub const SESSION_CLOSED: i64 = -32002;
    pub const WRONG_STATE: i64 = -32003;
    pub const SHUTTING_DOWN: i64 = -32004;
    pub const OVER_CAPACITY: i64 = -32005;
    pub const RATE_LIMITED: i64 = -32006;
    pub const TOO_LARGE: i64 = -32007;
    pub const ELSEWHERE: i64 = -32008;
    pub const LEFT_FOR_RECOVERY: i64 = -32009;
}

/// An error answer: its JSON-RPC code, its kind and a sentence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RpcError {
    pub code: i64,
    pub kind: ErrorKind,
    pub message: String,
    /// For `elsewhere`: where the session's owner is reached (`data.owner`).
    pub owner: Option<String>,
}

impl RpcError {
    /// An error answer; a message that echoes a huge request is cut (see
    /// [`bounded_message`]), so that the answer fits in a frame.
    pub fn new(code: i64, kind: ErrorKind, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = match bounded_message(&message) {
            Cow::Borrowed(_) => message,
            Cow::Owned(cut) => cut,
        };
        RpcError {
            code,
            kind,
            message,
            owner: None,
        }
    }

    /// Another live process owns session `id`, reached at `owner` (SPEC
    /// §12); with no owner, it was handed off and `session.attach` adopts it.
    pub fn elsewhere(id: u64, owner: Option<String>) -> Self {
        let message = match &owner {
            Some(url) => format!(
                "session {id} is served by another process: reconnect to {url} and attach there"
            ),
            None => format!("session {id} was handed off by its process: session.attach adopts it"),
        };
        RpcError {
            owner,
            ..RpcError::new(code::ELSEWHERE, ErrorKind::Elsewhere, message)
        }
    }

    pub fn bad_params(message: impl std::fmt::Display) -> Self {
        RpcError::new(
            code::INVALID_PARAMS,
            ErrorKind::BadRequest,
            format!("invalid params: {message}"),
        )
    }

    /// Session `id` is `state` in the store, and served by no process of
    /// this gateway: another process owns it, most likely one that stopped
    /// without ending it (G8). Said only to its own principal.
    pub fn left_for_recovery(id: u64, state: State) -> Self {
        RpcError::new(
            code::LEFT_FOR_RECOVERY,
            ErrorKind::LeftForRecovery,
            // No run between quote marks is longer than a message may
            // quote (see `bounded_message`), whatever the id.
            format!(
                "session {id} is {state} in the store, but no process serves it here: the \
                 process that ran it stopped without ending it (a crash, a lost lease), or \
                 another program runs it; `session.read` reads what it stored, and once that \
                 process is gone, `settle recover` (or the kernel's `recover()`) ends it \
                 `recovered`, its chunks kept"
            ),
        )
    }

    pub fn not_found(id: u64) -> Self {
        RpcError::new(
            code::NOT_FOUND,
            ErrorKind::NotFound,
            format!("no session {id}; see sessions.list"),
        )
    }

    pub fn shutting_down() -> Self {
        RpcError::new(
            code::SHUTTING_DOWN,
            ErrorKind::ShuttingDown,
            "the gateway is shutting down: it starts no session or turn, and ends every session itself",
        )
    }

    /// The answer to a runtime's refusal, sorted by what the client can do
    /// about it.
    pub fn from_runtime(error: &RuntimeError) -> Self {
        use settle_runtime::RuntimeError as R;
        let (code, kind) = match error {
            e if e.is_session_closed() => (code::SESSION_CLOSED, ErrorKind::SessionClosed),
            R::Lifecycle(CoreError::UnknownSession(id)) => return RpcError::not_found(id.get()),
            // A session live in another process, which this gateway does
            // not serve (in a fleet, `elsewhere` says where, before this):
            // one a process that stopped left, or another program's. It
            // exists, and its principal is told so (a method asks whose
            // it is first: to another principal it is `not_found`).
            R::LiveElsewhere { session, state } => {
                return RpcError::left_for_recovery(session.get(), *state)
            }
            R::Lifecycle(CoreError::HandedOff(id)) => return RpcError::elsewhere(id.get(), None),
            R::Store(StoreError::Elsewhere { session, advertise }) => {
                return RpcError::elsewhere(session.get(), advertise.clone())
            }
            // The store refused this process's write: the session was
            // released or adopted elsewhere meanwhile (this process's lease
            // ran out while it was stopped, say). Where it went is looked
            // up by the caller (`call`), which knows which session it is.
            R::Store(StoreError::HandedOff { session, .. }) => {
                return RpcError::elsewhere(session.get(), None)
            }
            // This process lost its lease on its sessions: it stops.
            R::Lifecycle(CoreError::ShuttingDown)
            | R::Stopped
            | R::Store(StoreError::LeaseLost(_)) => return RpcError::shutting_down(),
            R::Lifecycle(CoreError::OverCapacity { .. }) => {
                tracing::warn!(%error, "refused a session: the session cap is full and nothing can be evicted");
                (code::OVER_CAPACITY, ErrorKind::OverCapacity)
            }
            R::Lifecycle(CoreError::NoRoomToAdopt { .. }) => {
                tracing::warn!(%error, "refused an adoption: the session cap is full (an adoption evicts nothing)");
                (code::OVER_CAPACITY, ErrorKind::OverCapacity)
            }
            R::Lifecycle(_) | R::NoSlot(_) | R::NotResumable { .. } => {
                (code::WRONG_STATE, ErrorKind::WrongState)
            }
            R::SessionClosed(_) => (code::SESSION_CLOSED, ErrorKind::SessionClosed),
            R::TooLarge { .. } => (code::TOO_LARGE, ErrorKind::TooLarge),
            R::NulInName | R::BlankName | R::NameTooLong { .. } => {
                return RpcError::bad_params(error.to_string())
            }
            // Store failures, and whatever a later runtime adds.
            _ => (code::INTERNAL, ErrorKind::Internal),
        };
        RpcError::new(code, kind, error.to_string())
    }
}

/// A request as read from a frame.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Incoming {
    /// `None` for a notification (no `id`: no answer); otherwise a string
    /// or an integer, never null.
    pub id: Option<Value>,
    pub method: String,
    /// The params object; an empty one when left out.
    pub params: Value,
}

/// The most characters of a string `id`: every answer echoes its id, and
/// must fit in a frame beside what it says.
pub(crate) const MAX_ID_CHARS: usize = 256;

/// The most bytes a result's frame has besides its result: the JSON-RPC
/// members and the longest id, each of its characters escaped (`\u001f`).
pub(crate) const MAX_RESULT_ENVELOPE_BYTES: usize = 64 + 6 * MAX_ID_CHARS;

/// Reads one frame. A frame that is not a request gives the error to answer
/// with, and the id to answer to (null when it cannot be read).
pub(crate) fn parse(text: &str) -> Result<Incoming, (Value, RpcError)> {
    // A key twice is refused: read one way only (see `strict_json`).
    let value: Value = crate::strict_json::from_str(text).map_err(|e| {
        let message = match e.classify() {
            serde_json::error::Category::Data => {
                format!("JSON read one way only (each key once per object): {e}")
            }
            _ => format!("not JSON: {e}"),
        };
        (
            Value::Null,
            RpcError::new(code::PARSE_ERROR, ErrorKind::BadRequest, message),
        )
    })?;
    let invalid = |id: Value, why: &str| {
        (
            id,
            RpcError::new(
                code::INVALID_REQUEST,
                ErrorKind::BadRequest,
                format!("not a JSON-RPC 2.0 request: {why}"),
            ),
        )
    };
    let mut object = match value {
        Value::Object(object) => object,
        Value::Array(_) => {
            return Err(invalid(
                Value::Null,
                "batches are not supported; send one request per frame",
            ))
        }
        _ => return Err(invalid(Value::Null, "expected an object")),
    };
    let id = match object.remove("id") {
        None => None,
        Some(Value::String(id)) if id.chars().count() > MAX_ID_CHARS => {
            // Echoed in the answer, a huge id would not fit in a frame.
            let why = format!(
                "`id` is a string of {} characters; at most {MAX_ID_CHARS}",
                id.chars().count()
            );
            return Err(invalid(Value::Null, &why));
        }
        // Read as a float, a number outside the 64-bit integers or with a
        // fraction or an exponent (or -0) would be echoed as another
        // number: refused, as JSON-RPC advises against fractional ids.
        Some(Value::Number(n)) if !(n.is_i64() || n.is_u64()) => {
            return Err(invalid(
                Value::Null,
                "a number `id` must be an integer from -9223372036854775808 to \
                 18446744073709551615 written without a fraction or an exponent (nor -0), \
                 so that the answer echoes it exactly; send other ids as strings",
            ));
        }
        // A null `id` is neither an id an answer could be matched by nor
        // the notification a missing one makes: refused, so that a
        // request that writes is never carried out unanswerable.
        Some(Value::Null) => {
            return Err(invalid(
                Value::Null,
                "`id` must be a string or an integer, not null; \
                 leave `id` out to send a notification",
            ))
        }
        Some(id @ (Value::Number(_) | Value::String(_))) => Some(id),
        Some(_) => return Err(invalid(Value::Null, "`id` must be a string or an integer")),
    };
    let answer_to = id.clone().unwrap_or(Value::Null);
    if object.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Err(invalid(answer_to, "`jsonrpc` must be \"2.0\""));
    }
    let method = match object.remove("method") {
        Some(Value::String(method)) => method,
        _ => return Err(invalid(answer_to, "`method` must be a string")),
    };
    let params = match object.remove("params") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(params @ Value::Object(_)) => params,
        Some(_) => {
            return Err((
                answer_to,
                RpcError::bad_params("params go by name, as an object"),
            ))
        }
    };
    Ok(Incoming { id, method, params })
}

/// The frame of a successful answer.
pub(crate) fn result(id: &Value, result: Value) -> String {
    json!({ "jsonrpc": "2.0", "id": id, "result": result }).to_string()
}

/// The frame of an error answer.
pub(crate) fn error(id: &Value, error: &RpcError) -> String {
    json!({
        "jsonrpc": "2.0",
        "id": id,
        "error": {
            "code": error.code,
            "message": error.message,
            "data": match error.kind {
                ErrorKind::Elsewhere => json!({ "kind": error.kind.as_str(), "owner": error.owner }),
                kind => json!({ "kind": kind.as_str() }),
            },
        },
    })
    .to_string()
}

/// The frame of a notification.
pub(crate) fn notification(method: &str, params: Value) -> String {
    json!({ "jsonrpc": "2.0", "method": method, "params": params }).to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn refused(text: &str) -> (Value, RpcError) {
        parse(text).unwrap_err()
    }

    #[test]
    fn reads_a_request_and_a_notification() {
        let request = parse(
            r#"{"jsonrpc":"2.0","id":7,"method":"turn.start","params":{"id":1,"prompt":"hi"}}"#,
        )
        .unwrap();
        assert_eq!(request.id, Some(json!(7)));
        assert_eq!(request.method, "turn.start");
        assert_eq!(request.params["prompt"], "hi");
        let notification = parse(r#"{"jsonrpc":"2.0","method":"sessions.list"}"#).unwrap();
        assert_eq!(notification.id, None);
        assert_eq!(notification.params, json!({}));
    }

    #[test]
    fn refuses_what_is_not_a_request_with_the_code_and_kind_to_answer() {
        let cases = [
            ("{not json", Value::Null, code::PARSE_ERROR),
            ("[1, 2]", Value::Null, code::INVALID_REQUEST),
            ("42", Value::Null, code::INVALID_REQUEST),
            (r#"{"id":1,"method":"x"}"#, json!(1), code::INVALID_REQUEST),
            (
                r#"{"jsonrpc":"2.0","id":"a","method":3}"#,
                json!("a"),
                code::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc":"2.0","id":{},"method":"x"}"#,
                Value::Null,
                code::INVALID_REQUEST,
            ),
            (
                r#"{"jsonrpc":"2.0","id":2,"method":"x","params":[1]}"#,
                json!(2),
                code::INVALID_PARAMS,
            ),
            // A key twice: a proxy reading the first and the gateway the
            // last would disagree on what was asked, so it is refused whole.
            (
                r#"{"jsonrpc":"2.0","id":3,"method":"session.close","method":"x"}"#,
                Value::Null,
                code::PARSE_ERROR,
            ),
            (
                r#"{"jsonrpc":"2.0","id":4,"id":5,"method":"x"}"#,
                Value::Null,
                code::PARSE_ERROR,
            ),
            (
                r#"{"jsonrpc":"2.0","id":6,"method":"x","params":{"a":[{"id":1,"id":2}]}}"#,
                Value::Null,
                code::PARSE_ERROR,
            ),
        ];
        for (text, id, code) in cases {
            let (answer_to, error) = refused(text);
            assert_eq!(answer_to, id, "{text}");
            assert_eq!(error.code, code, "{text}");
            assert_eq!(error.kind, ErrorKind::BadRequest, "{text}");
        }
    }

    /// An id is echoed exactly or refused: a number outside the 64-bit
    /// integers, or with a fraction or an exponent, would come back as
    /// another number.
    #[test]
    fn g11_a_number_id_that_cannot_be_echoed_exactly_is_refused_to_null() {
        for id in [
            "18446744073709551616",
            "-9223372036854775809",
            "1e2",
            "1.5",
            "1.0",
            "-0.0",
            "-0",
        ] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"sessions.list"}}"#);
            let (answer_to, error) = refused(&text);
            assert_eq!(answer_to, Value::Null, "{id}");
            assert_eq!(error.code, code::INVALID_REQUEST, "{id}");
            assert_eq!(error.kind, ErrorKind::BadRequest, "{id}");
            assert!(error.message.contains("`id`"), "{id}: {}", error.message);
        }
        for id in [
            "18446744073709551615",
            "-9223372036854775808",
            "0",
            "-1",
            r#""1.5""#,
        ] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"sessions.list"}}"#);
            let request = parse(&text).unwrap();
            let answer = result(request.id.as_ref().unwrap(), json!({}));
            assert!(answer.contains(&format!(r#""id":{id},"#)), "{answer}");
        }
    }

    /// A request without `id` is a notification; one whose `id` is null
    /// is neither a request that can be answered nor a notification.
    #[test]
    fn a_null_id_is_refused_to_null_while_a_missing_id_makes_a_notification() {
        let (answer_to, error) =
            refused(r#"{"jsonrpc":"2.0","id":null,"method":"session.create"}"#);
        assert_eq!(answer_to, Value::Null);
        assert_eq!(error.code, code::INVALID_REQUEST);
        assert_eq!(error.kind, ErrorKind::BadRequest);
        assert!(error.message.contains("`id`"), "{}", error.message);
        let notification = parse(r#"{"jsonrpc":"2.0","method":"session.create"}"#).unwrap();
        assert_eq!(notification.id, None);
    }

    #[test]
    fn a_session_left_for_recovery_is_said_whole_whatever_its_id_and_state() {
        let error = RpcError::left_for_recovery(u64::MAX, State::Cancelling);
        assert_eq!(error.code, code::LEFT_FOR_RECOVERY);
        assert_eq!(error.kind.as_str(), "left_for_recovery");
        assert!(
            !error.message.contains("characters in all"),
            "{}",
            error.message
        );
        assert!(
            error.message.ends_with("its chunks kept"),
            "{}",
            error.message
        );
    }

    #[test]
    fn an_error_frame_carries_its_kind() {
        let frame = error(&json!(3), &RpcError::not_found(9));
        let value: Value = serde_json::from_str(&frame).unwrap();
        assert_eq!(value["id"], 3);
        assert_eq!(value["error"]["code"], code::NOT_FOUND);
        assert_eq!(value["error"]["data"]["kind"], "not_found");
    }
}
