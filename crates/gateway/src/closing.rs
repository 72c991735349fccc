//! Why the gateway ends a connection: the closing frame it sends first.
//!
//! A client whose connection the gateway ends is told why in the closing
//! frame's code and reason (RFC 6455 §7.4), not left with a dropped socket:
//! `1001` when the gateway shuts down, `1009` for a message over the
//! gateway's limit (the limit named), `1007` for text that is not UTF-8
//! (a message or a closing reason), `1002` for a frame that breaks the
//! WebSocket protocol (reserved bits or opcodes, a fragmented or oversized
//! control frame, a continuation out of place: RFC 6455 §7.1.7 asks the
//! endpoint that fails a connection to say so), `1000` for the connection
//! idle timeout and `1011` for a client silent for two keepalive intervals
//! (each timeout named). A read that failed for any other reason (the
//! socket reset or closed without a handshake, a frame after the closing
//! one) gets no frame: there is no one left to tell.

use std::time::Duration;

use axum::extract::ws::{close_code, CloseFrame};
use tungstenite::error::{CapacityError, Error as WsError, ProtocolError};

/// A closing frame the gateway sends: its code and reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Closing {
    code: u16,
    reason: String,
}

impl Closing {
    /// The gateway is shutting down (`1001`, going away).
    pub(crate) fn going_away() -> Closing {
        Closing {
            code: close_code::AWAY,
            reason: "the gateway is shutting down".into(),
        }
    }

    /// The answer to a client's closing frame. The WebSocket layer sends
    /// its own (the client's code echoed) in its place: this only has it
    /// written before the connection goes.
    pub(crate) fn answer() -> Closing {
        Closing {
            code: close_code::NORMAL,
            reason: String::new(),
        }
    }

    /// The connection was attached to no session and sent no request for
    /// the connection idle timeout, `after` (`1000`, normal closure).
    pub(crate) fn idle(after: Duration) -> Closing {
        // 1000: nothing went wrong, and nothing is left for the connection
        // to do (it watches no session and asks nothing), which is what
        // RFC 6455 §7.4.1 says of a normal closure. Not 1001, which here
        // says the gateway shuts down, upon which a fleet's client moves
        // to another process.
        Closing {
            code: close_code::NORMAL,
            reason: format!(
                "idle: no request for {} and attached to no session",
                humantime::format_duration(after)
            ),
        }
    }

    /// The client sent nothing, not even a pong, for two keepalive
    /// intervals of `every` (`1011`): it is taken for gone.
    pub(crate) fn silent(every: Duration) -> Closing {
        // RFC 6455 §7.4.1 names no code for a peer gone silent. 1011 (an
        // unexpected condition that keeps the server from going on) fits,
        // and is what WebSocket libraries send when their keepalive ping
        // goes unanswered (Python's websockets, for one). Not 1001, the
        // gateway's shutdown; not 1000, which says all went well; not 1002,
        // a protocol error, which a lost network cannot be told from.
        Closing {
            code: close_code::ERROR,
            reason: format!(
                "keepalive: no pong to the pings, nor any frame, for {}",
                humantime::format_duration(every.saturating_mul(2))
            ),
        }
    }

    /// What to tell a client whose message could not be read, if anything:
    /// `error` is the reader's, `max_message_bytes` the gateway's limit.
    pub(crate) fn for_unreadable(error: axum::Error, max_message_bytes: usize) -> Option<Closing> {
        let error = error.into_inner().downcast::<WsError>().ok()?;
        match *error {
            WsError::Capacity(CapacityError::MessageTooLong { .. }) => Some(Closing {
                code: close_code::SIZE,
                reason: format!("a message over the gateway's limit of {max_message_bytes} bytes"),
            }),
            WsError::Utf8(_) => Some(Closing {
                code: close_code::INVALID,
                // A text message, or a closing frame's reason: RFC 6455 asks both
                // to be UTF-8, and tungstenite says which in neither case.
                reason: "text that is not UTF-8 (a text message or a closing reason)".into(),
            }),
            // The connection is gone or closing: nobody reads a frame now.
            WsError::Protocol(
                ProtocolError::ResetWithoutClosingHandshake
                | ProtocolError::ReceivedAfterClosing
                | ProtocolError::SendAfterClosing,
            ) => None,
            WsError::Protocol(broken) => Some(Closing {
                code: close_code::PROTOCOL,
                reason: fit(format!("a WebSocket protocol error: {broken}")),
            }),
            _ => None,
        }
    }

    /// The closing code.
    pub(crate) fn code(&self) -> u16 {
        self.code
    }

    /// The closing reason.
    pub(crate) fn reason(&self) -> &str {
        &self.reason
    }

    /// The closing frame to send.
    pub(crate) fn frame(&self) -> CloseFrame {
        CloseFrame {
            code: self.code,
            reason: self.reason.as_str().into(),
        }
    }
}

/// `reason` cut to what a closing frame carries (123 bytes, RFC 6455
/// §5.5: a control frame's 125 less the code), at a character boundary.
fn fit(mut reason: String) -> String {
    const MAX: usize = 123;
    if reason.len() > MAX {
        let mut end = MAX;
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        reason.truncate(end);
    }
    reason
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_too_long_is_1009_with_the_limit_and_fits_a_close_frame() {
        let error = axum::Error::new(WsError::Capacity(CapacityError::MessageTooLong {
            size: usize::MAX,
            max_size: usize::MAX,
        }));
        let closing =
            Closing::for_unreadable(error, usize::MAX).unwrap_or_else(Closing::going_away);
        assert_eq!(closing.code(), 1009);
        assert!(closing.reason.contains(&usize::MAX.to_string()));
        // RFC 6455 §5.5: a control frame's payload, the code's two bytes
        // included, is at most 125 bytes.
        assert!(closing.reason.len() <= 123);
    }

    #[test]
    fn a_protocol_error_is_1002_cut_to_a_close_frame_and_a_reset_is_told_nothing() {
        // The longest a protocol error says: the bytes of a data frame
        // where a continuation was due, multi-byte characters at the cut.
        let long =
            ProtocolError::ExpectedFragment(tungstenite::protocol::frame::coding::Data::Text);
        let closing = Closing::for_unreadable(axum::Error::new(WsError::Protocol(long)), 1)
            .unwrap_or_else(Closing::going_away);
        assert_eq!(closing.code(), 1002);
        assert_eq!(fit("é".repeat(100)).len(), 122);
        assert!(fit("x".repeat(500)).len() == 123);
        let reset = ProtocolError::ResetWithoutClosingHandshake;
        assert_eq!(
            Closing::for_unreadable(axum::Error::new(WsError::Protocol(reset)), 1),
            None
        );
    }

    #[test]
    fn a_timeout_closes_with_its_code_and_a_reason_naming_it_that_fits_a_close_frame() {
        let idle = Closing::idle(Duration::from_secs(5 * 60));
        assert_eq!(idle.code(), 1000);
        assert!(idle.reason.contains("5m"), "{}", idle.reason);
        let silent = Closing::silent(Duration::from_secs(30));
        assert_eq!(silent.code(), 1011);
        assert!(silent.reason.contains("1m"), "{}", silent.reason);
        // The longest a duration is written still fits (RFC 6455 §5.5).
        for closing in [Closing::idle(Duration::MAX), Closing::silent(Duration::MAX)] {
            assert!(closing.reason.len() <= 123, "{}", closing.reason);
        }
    }

    #[test]
    fn a_reset_socket_gets_no_frame() {
        let error = axum::Error::new(WsError::ConnectionClosed);
        assert_eq!(Closing::for_unreadable(error, 1), None);
        let error = axum::Error::new(std::io::Error::other("reset"));
        assert_eq!(Closing::for_unreadable(error, 1), None);
    }
}
