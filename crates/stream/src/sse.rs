//! A server-sent-events decoder whose cost is linear in what it is fed.
//!
//! Sans-IO: [`SseDecoder::feed`] takes the bytes of a body as they arrive
//! and queues the `data` of every event they complete. Each byte is looked
//! at once and copied at most twice (into the unfinished line, then into the
//! event's data): a line that arrives in many pieces is never searched again
//! from its start, which is what made a long line cost quadratic time in the
//! parser this replaces. An event larger than the maximum is refused as soon
//! as it grows past it, so a server cannot make a turn hold more than that.
//!
//! What it decodes (the WHATWG event-stream format): lines end with LF, CR or
//! CRLF, also across pieces; a leading BOM is skipped; `:` starts a comment
//! (counted, as keepalives); `data` fields are joined with LF; an empty line
//! ends an event, and an event without data is not one. `event`, `id` and
//! `retry` are read and ignored: a chat completion does not use them.

use std::collections::VecDeque;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// Why a body is not an event stream this decoder accepts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// An event grew past the maximum event size.
    #[error("an event is larger than the maximum event size of {max} bytes")]
    TooLarge {
        /// The maximum, in bytes.
        max: usize,
    },
    /// A line is not UTF-8.
    #[error("a line is not valid UTF-8")]
    NotUtf8,
}

/// Decodes one event stream. After an error it accepts nothing more.
#[derive(Debug)]
pub struct SseDecoder {
    max_event: usize,
    /// The unfinished line: bytes fed after the last line end.
    line: Vec<u8>,
    /// The data of the event being read, each line followed by LF.
    data: String,
    /// The bytes of the event being read, as sent (its finished lines).
    event_bytes: usize,
    /// The last byte fed was a CR: an LF first in the next piece is its pair.
    after_cr: bool,
    /// The start of the stream, where a BOM may be.
    at_start: bool,
    events: VecDeque<String>,
    comments: usize,
    failed: Option<SseError>,
    #[cfg(test)]
    counts: Counts,
}

/// What decoding cost, for the tests that check it is linear.
#[cfg(test)]
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counts {
    /// Bytes looked at in the search for line ends.
    pub(crate) scanned: usize,
    /// Bytes copied into the unfinished line or an event's data.
    pub(crate) copied: usize,
}

impl SseDecoder {
    /// A decoder that refuses events over `max_event` bytes.
    pub fn new(max_event: usize) -> Self {
        SseDecoder {
            max_event,
            line: Vec::new(),
            data: String::new(),
            event_bytes: 0,
            after_cr: false,
            at_start: true,
            events: VecDeque::new(),
            comments: 0,
            failed: None,
            #[cfg(test)]
            counts: Counts::default(),
        }
    }

    /// Decodes the next piece of the body; the events it completes are then
    /// [`next_event`](Self::next_event)'s. An error is final.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), SseError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        if self.at_start {
            // The first bytes are held back while they may be a BOM, which
            // can arrive in pieces too (at most three bytes are copied).
            let take = (BOM.len() - self.line.len()).min(bytes.len());
            let mut start = self.line.clone();
            start.extend_from_slice(&bytes[..take]);
            if start == BOM {
                self.line.clear();
                self.at_start = false;
                bytes = &bytes[take..];
            } else if take == bytes.len() && BOM.starts_with(&start) {
                self.line = start;
                return Ok(());
            } else {
                // Not a BOM: what was held back starts the first line.
                self.at_start = false;
            }
        }
        let result = self.feed_lines(bytes);
        if let Err(error) = &result {
            self.failed = Some(error.clone());
            self.line = Vec::new();
            self.data = String::new();
        }
        result
    }

    fn feed_lines(&mut self, mut bytes: &[u8]) -> Result<(), SseError> {
        if self.after_cr {
            self.after_cr = false;
            if let Some(rest) = bytes.strip_prefix(b"\n") {
                bytes = rest;
            }
        }
        while let Some(end) = bytes.iter().position(|&b| b == b'\n' || b == b'\r') {
            #[cfg(test)]
            {
                self.counts.scanned += end + 1;
            }
            let (head, rest) = bytes.split_at(end);
            let cr = rest[0] == b'\r';
            bytes = &rest[1..];
            if cr {
                match bytes.first() {
                    Some(b'\n') => bytes = &bytes[1..],
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            if self.line.is_empty() {
                self.check_size(head.len())?;
                self.line_done(head)?;
            } else {
                self.check_size(self.line.len() + head.len())?;
                let mut line = std::mem::take(&mut self.line);
                self.copy_into_line(&mut line, head);
                let done = self.line_done(&line);
                line.clear();
                // The allocation is kept for the next unfinished line.
                self.line = line;
                done?;
            }
        }
        #[cfg(test)]
        {
            self.counts.scanned += bytes.len();
        }
        if !bytes.is_empty() {
            self.check_size(self.line.len() + bytes.len())?;
            let mut line = std::mem::take(&mut self.line);
            self.copy_into_line(&mut line, bytes);
            self.line = line;
        }
        Ok(())
    }

    fn copy_into_line(&mut self, line: &mut Vec<u8>, bytes: &[u8]) {
        #[cfg(test)]
        {
            self.counts.copied += bytes.len();
        }
        line.extend_from_slice(bytes);
    }

    /// Refuses an event whose finished lines and unfinished `line` of
    /// `line_len` bytes are over the maximum.
    fn check_size(&self, line_len: usize) -> Result<(), SseError> {
        if self.event_bytes.saturating_add(line_len) > self.max_event {
            return Err(SseError::TooLarge {
                max: self.max_event,
            });
        }
        Ok(())
    }

    /// One whole line, without its line end.
    fn line_done(&mut self, line: &[u8]) -> Result<(), SseError> {
        if line.is_empty() {
            self.event_bytes = 0;
            if !self.data.is_empty() {
                let mut data = std::mem::take(&mut self.data);
                data.pop();
                self.events.push_back(data);
            }
            return Ok(());
        }
        // Counts the line end too, so that many empty fields add up.
        self.event_bytes = self.event_bytes.saturating_add(line.len() + 1);
        if line[0] == b':' {
            self.comments += 1;
            return Ok(());
        }
        let (name, value) = match line.iter().position(|&b| b == b':') {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        if name == b"data" {
            let value = std::str::from_utf8(value).map_err(|_| SseError::NotUtf8)?;
            #[cfg(test)]
            {
                self.counts.copied += value.len();
            }
            self.data.push_str(value);
            self.data.push('\n');
        }
        Ok(())
    }

    /// The data of the next event decoded, oldest first.
    pub fn next_event(&mut self) -> Option<String> {
        self.events.pop_front()
    }

    /// How many comment lines were decoded so far.
    pub fn comments(&self) -> usize {
        self.comments
    }

    #[cfg(test)]
    pub(crate) fn counts(&self) -> Counts {
        self.counts
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn events(decoder: &mut SseDecoder) -> Vec<String> {
        std::iter::from_fn(|| decoder.next_event()).collect()
    }

    /// Feeds `body` in pieces of `piece` bytes.
    fn decode(body: &[u8], piece: usize, max: usize) -> (SseDecoder, Result<(), SseError>) {
        let mut decoder = SseDecoder::new(max);
        for part in body.chunks(piece.max(1)) {
            if let Err(e) = decoder.feed(part) {
                return (decoder, Err(e));
            }
        }
        (decoder, Ok(()))
    }

    #[test]
    fn a_long_line_is_scanned_once_and_copied_at_most_twice_per_byte() {
        // The cost of one line of n bytes fed in 1 KiB pieces, for growing n:
        // linear means the same cost per byte at every size.
        for mib in [1, 4, 16] {
            let len = mib * 1024 * 1024;
            let mut body = b"data: ".to_vec();
            body.resize(body.len() + len, b'x');
            body.extend_from_slice(b"\n\n");
            let (mut decoder, result) = decode(&body, 1024, usize::MAX);
            result.unwrap();
            let counts = decoder.counts();
            assert_eq!(
                counts.scanned,
                body.len(),
                "{mib} MiB: every byte looked at once"
            );
            assert!(
                counts.copied <= 2 * body.len(),
                "{mib} MiB: {} bytes copied for a body of {}",
                counts.copied,
                body.len()
            );
            let got = events(&mut decoder);
            assert_eq!(got.len(), 1);
            assert_eq!(got[0].len(), len);
        }
    }

    #[test]
    fn many_short_lines_in_one_piece_cost_linear_time_too() {
        let mut body = Vec::new();
        for i in 0..100_000 {
            body.extend_from_slice(format!("data: {i}\n\n").as_bytes());
        }
        let (mut decoder, result) = decode(&body, body.len(), 1024);
        result.unwrap();
        assert_eq!(decoder.counts().scanned, body.len());
        // Whole lines in a piece are read in place, not copied first.
        assert!(decoder.counts().copied < body.len());
        assert_eq!(events(&mut decoder).len(), 100_000);
    }

    #[test]
    fn an_event_over_the_maximum_is_refused_as_it_grows_past_it() {
        let mut body = b"data: ".to_vec();
        body.resize(10_000, b'x');
        let (decoder, result) = decode(&body, 100, 4096);
        assert_eq!(result, Err(SseError::TooLarge { max: 4096 }));
        // Refused within one piece of the maximum, not at the line's end.
        assert!(decoder.counts().scanned <= 4096 + 100);
        // Nothing more is accepted.
        let mut decoder = decoder;
        assert!(decoder.feed(b"\n\ndata: x\n\n").is_err());
        assert!(decoder.next_event().is_none());
    }

    #[test]
    fn the_maximum_counts_every_line_of_one_event() {
        // Three data lines of 400 bytes each: over 1 KiB together.
        let line = format!("data: {}\n", "y".repeat(400));
        let body = format!("{line}{line}{line}\n");
        let (_, result) = decode(body.as_bytes(), 7, 1024);
        assert_eq!(result, Err(SseError::TooLarge { max: 1024 }));
        // Each event alone is under it, even when the stream is not.
        let body = format!("{line}\n{line}\n{line}\n");
        let (mut decoder, result) = decode(body.as_bytes(), 7, 1024);
        result.unwrap();
        assert_eq!(events(&mut decoder).len(), 3);
    }

    #[test]
    fn line_ends_of_every_kind_also_across_pieces() {
        let body = b"data: a\r\ndata: b\rdata: c\n\r\ndata: d\r\r: ping\n\n";
        for piece in 1..body.len() {
            let (mut decoder, result) = decode(body, piece, 1024);
            result.unwrap();
            assert_eq!(events(&mut decoder), ["a\nb\nc", "d"], "pieces of {piece}");
            assert_eq!(decoder.comments(), 1, "pieces of {piece}");
        }
    }

    #[test]
    fn fields_comments_and_a_bom() {
        let body =
            "\u{feff}: hello\nevent: x\nid: 1\nretry: 5\ndata\ndata:no space\ndata:  two\n\n\
                    event: only\n\ndata: {\"a\": 1}\n\n";
        for piece in 1..8 {
            let (mut decoder, result) = decode(body.as_bytes(), piece, 1024);
            result.unwrap();
            assert_eq!(
                events(&mut decoder),
                ["\nno space\n two", "{\"a\": 1}"],
                "pieces of {piece}"
            );
            assert_eq!(decoder.comments(), 1);
        }
    }

    #[test]
    fn a_multibyte_character_split_across_pieces_is_whole() {
        let body = "data: héllo ✓\n\n".as_bytes();
        for piece in 1..body.len() {
            let (mut decoder, result) = decode(body, piece, 1024);
            result.unwrap();
            assert_eq!(events(&mut decoder), ["héllo ✓"]);
        }
        let (_, result) = decode(b"data: \xff\n\n", 3, 1024);
        assert_eq!(result, Err(SseError::NotUtf8));
    }

    #[test]
    fn an_unfinished_event_at_the_end_is_not_an_event() {
        let (mut decoder, result) = decode(b"data: a\n\ndata: b\n", 4, 1024);
        result.unwrap();
        assert_eq!(events(&mut decoder), ["a"]);
    }
}
