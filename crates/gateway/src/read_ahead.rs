//! [`ReadAhead`]: what a connection reads while one of its requests is
//! carried out.
//!
//! A request may wait on the store as long as the store takes (a
//! `session.close` behind a database another process locked). Its
//! connection reads its socket all the same: the WebSocket layer answers
//! the client's pings as it reads, and a pong, like any frame, tells the
//! keepalive that the client is there. The requests read meanwhile are
//! kept here, in order, and carried out one at a time once the one before
//! is answered, as if read then: answers keep the order of requests, and a
//! request's rate and store timeout count from when it is carried out.
//!
//! What a client may have kept is bounded ([`Bounds`]): past it the socket
//! is not read until the request carried out is answered and one kept is
//! taken, as every request was read before, so a client that sends requests
//! faster than the store answers them waits in its own socket, not in the
//! gateway's memory.

use std::collections::VecDeque;

use axum::extract::ws::Message;

/// One read of the socket: a message, a failure, or `None` when it ended.
pub(crate) type Read = Option<Result<Message, axum::Error>>;

/// The most requests a connection may have read ahead.
pub(crate) const REQUESTS: usize = 16;

/// The bounds of a connection's read-ahead.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Requests (text or binary frames) kept.
    pub requests: usize,
    /// Their bytes: once this many are kept, no more is read.
    pub bytes: usize,
}

/// The reads of a connection kept while a request is carried out.
#[derive(Debug)]
pub(crate) struct ReadAhead {
    kept: VecDeque<Read>,
    bytes: usize,
    bounds: Bounds,
    /// A read that ends the connection was kept (its closing frame, a
    /// failure, the socket's end): nothing is read after it.
    ended: bool,
}

impl ReadAhead {
    pub(crate) fn new(bounds: Bounds) -> Self {
        ReadAhead {
            kept: VecDeque::new(),
            bytes: 0,
            bounds,
            ended: false,
        }
    }

    /// Whether the socket may be read: nothing that ends the connection was
    /// read, and the reads kept are within their bounds.
    pub(crate) fn reads(&self) -> bool {
        !self.ended && self.kept.len() < self.bounds.requests && self.bytes < self.bounds.bytes
    }

    /// Whether a read is kept, to be taken before the socket is read again.
    pub(crate) fn has_kept(&self) -> bool {
        !self.kept.is_empty()
    }

    /// Keeps `read` for when the request being carried out is answered.
    /// A ping or a pong is not kept: the WebSocket layer answered the ping
    /// as it read it, and either only says that the client is there.
    pub(crate) fn keep(&mut self, read: Read) {
        match &read {
            Some(Ok(Message::Ping(_) | Message::Pong(_))) => return,
            Some(Ok(Message::Text(text))) => self.bytes += text.len(),
            Some(Ok(Message::Binary(bytes))) => self.bytes += bytes.len(),
            Some(Ok(Message::Close(_)) | Err(_)) | None => self.ended = true,
        }
        self.kept.push_back(read);
    }

    /// The oldest read kept, if any.
    pub(crate) fn take(&mut self) -> Option<Read> {
        let read = self.kept.pop_front()?;
        match &read {
            Some(Ok(Message::Text(text))) => self.bytes -= text.len(),
            Some(Ok(Message::Binary(bytes))) => self.bytes -= bytes.len(),
            _ => {}
        }
        Some(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> Read {
        Some(Ok(Message::text(s)))
    }

    #[test]
    fn reads_are_taken_in_order_and_pings_and_pongs_are_not_kept() {
        let mut ahead = ReadAhead::new(Bounds {
            requests: 4,
            bytes: 1024,
        });
        ahead.keep(text("a"));
        ahead.keep(Some(Ok(Message::Ping(Default::default()))));
        ahead.keep(Some(Ok(Message::Pong(Default::default()))));
        ahead.keep(text("b"));
        let taken: Vec<String> = std::iter::from_fn(|| ahead.take())
            .map(|read| match read {
                Some(Ok(Message::Text(text))) => text.as_str().to_owned(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(taken, ["a", "b"]);
        assert!(ahead.reads());
    }

    #[test]
    fn the_socket_is_not_read_past_the_bounds_nor_after_its_end() {
        let mut ahead = ReadAhead::new(Bounds {
            requests: 2,
            bytes: 10,
        });
        ahead.keep(text("a"));
        assert!(ahead.reads());
        ahead.keep(text("b"));
        assert!(!ahead.reads(), "two requests kept");
        ahead.take();
        assert!(ahead.reads(), "room again once one is taken");
        ahead.keep(text("0123456789"));
        assert!(!ahead.reads(), "ten bytes kept");
        ahead.take();
        ahead.take();
        assert!(ahead.reads());
        ahead.keep(None);
        assert!(!ahead.reads(), "nothing is read after the socket's end");
        assert!(ahead.has_kept());
    }
}
