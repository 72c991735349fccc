//! `session.read`: what a turn of a session streamed, read back from the
//! store, for a client that was not attached (it reconnected, or joined
//! late) or missed notifications. Chunks come from a given `seq` (and part),
//! cut in parts as the notifications cut them, a page at a time: an answer
//! never outgrows a frame, and its `next` says where the next page starts.

use serde_json::{json, Value};
use settle_runtime::SessionId;
use settle_store::{ChunkKind, TurnPage};

use crate::excerpt::{bounded, MAX_MESSAGE_CHARS};
use crate::parts::{self, Payload};
use crate::protocol::{RpcError, MAX_RESULT_ENVELOPE_BYTES};

/// Where a read starts: a turn (its number; the last when `None`), a
/// chunk's `seq` in it and a part of that chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct From {
    pub turn: Option<u32>,
    pub seq: u32,
    pub part: u32,
}

/// The most chunks a page of `page_bytes` can hold: each gives at least one
/// part, and no part is smaller than an empty one of the first chunk.
pub(crate) fn most_chunks(id: SessionId, page_bytes: usize, part_bytes: usize) -> usize {
    let smallest = parts::params(id, 1, 0, Payload::Text(""), part_bytes)
        .first()
        .map_or(1, |p| p.to_string().len() + 1);
    page_bytes / smallest.max(1) + 1
}

/// The answer to `session.read` of `id` from `from`, on the store's `page`
/// of the turn it names: the turn's number, outcome and error, how many
/// turns the session has, its chunks from `from` within `page_bytes`, each
/// part within `part_bytes`, and where the next page starts (null once the
/// read reached the turn's last chunk).
///
/// The turn's error is stored whole (a provider's message may quote a
/// response body of megabytes): its message is bounded as a `turn.ended`
/// error's is. The page's bytes count all the answer has besides its
/// chunks, the frame's envelope with the longest id included, so that the
/// whole frame is within `page_bytes` (but for one part that alone is
/// larger, which a page always shows).
pub(crate) fn page(
    id: SessionId,
    page: &TurnPage,
    from: From,
    page_bytes: usize,
    part_bytes: usize,
) -> Result<Value, RpcError> {
    let count = page.turns;
    let turn = match (from.turn, page.turn.as_ref()) {
        (Some(no), None) => {
            return Err(RpcError::bad_params(format!(
                "session {id} has no turn {no}; it has {count}"
            )))
        }
        (_, turn) => turn,
    };
    let Some(turn) = turn else {
        return Ok(json!({
            "id": id.get(), "turns": 0, "turn": null, "outcome": null, "error": null,
            "chunks": [], "next": null,
        }));
    };
    let error = turn.error.as_ref().map_or(Value::Null, |e| {
        json!({
            "kind": e.kind.as_str(),
            "message": bounded(&e.message, MAX_MESSAGE_CHARS),
        })
    });
    let mut answer = json!({
        "id": id.get(),
        "turns": count,
        "turn": turn.no,
        "outcome": turn.outcome.map(|o| o.as_str()),
        "error": error,
        "chunks": [],
        // The longest `next` there is, for the count.
        "next": { "turn": u32::MAX, "seq": u32::MAX, "part": u32::MAX },
    });
    let envelope = answer.to_string().len() + MAX_RESULT_ENVELOPE_BYTES;
    let budget = page_bytes.saturating_sub(envelope);
    let mut chunks = Vec::new();
    let mut bytes = 0usize;
    let mut next = Value::Null;
    // The store's page begins at `from.seq`.
    'rows: for row in &turn.chunks {
        let payload = match (row.kind, &row.data) {
            (ChunkKind::Text, _) | (_, None) => Payload::Text(&row.text),
            (kind, Some(data)) => Payload::Data {
                kind: kind.as_str(),
                json: data,
            },
        };
        let first = if row.seq == from.seq { from.part } else { 0 };
        let parts = parts::params(id, turn.no, row.seq, payload, part_bytes);
        // One past the last part is where a client that has them all goes
        // on from; further is a cursor no answer gave, which would skip the
        // chunk without a word.
        if usize::try_from(first).map_or(true, |first| first > parts.len()) {
            return Err(RpcError::bad_params(format!(
                "chunk {} of turn {} of session {id} has {} parts (from 0); part {first} is past them",
                row.seq,
                turn.no,
                parts.len()
            )));
        }
        for (part, params) in parts.into_iter().enumerate().skip(first as usize) {
            let size = params.to_string().len() + 1;
            if bytes + size > budget && !chunks.is_empty() {
                next = json!({ "turn": turn.no, "seq": row.seq, "part": part });
                break 'rows;
            }
            bytes += size;
            chunks.push(params);
        }
    }
    if next.is_null() && page.more {
        // Every chunk read fitted (a read that began past a chunk's last
        // part): the next page goes on after them.
        if let Some(last) = turn.chunks.last() {
            next = json!({ "turn": turn.no, "seq": last.seq.saturating_add(1), "part": 0 });
        }
    }
    answer["chunks"] = Value::Array(chunks);
    answer["next"] = next;
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use settle_store::{ChunkRow, TurnRow};

    use super::*;

    fn turn_of(texts: impl Iterator<Item = String>) -> TurnRow {
        TurnRow {
            no: 1,
            outcome: None,
            started_at: SystemTime::UNIX_EPOCH,
            ended_at: None,
            input: None,
            error: None,
            chunks: texts
                .enumerate()
                .map(|(seq, text)| ChunkRow {
                    seq: u32::try_from(seq).unwrap_or(u32::MAX),
                    kind: ChunkKind::Text,
                    text,
                    data: None,
                })
                .collect(),
        }
    }

    /// As many of the smallest chunks as `most_chunks` allows never all fit
    /// in a page: the page stops before them and says where to go on, so
    /// reading no more rows than that loses nothing.
    #[test]
    fn the_chunks_a_page_is_read_with_are_more_than_it_holds() {
        let id = SessionId(1);
        let (page_bytes, part_bytes) = (4096, 1024);
        let most = most_chunks(id, page_bytes, part_bytes);
        let turn = turn_of((0..most).map(|_| String::new()));
        let answer = first_page(id, turn, page_bytes, part_bytes);
        let shown = answer["chunks"].as_array().map_or(0, Vec::len);
        assert!(shown < most, "{shown} of {most} shown");
        assert_eq!(answer["next"]["seq"], shown);
    }

    /// A read that begins past its first chunk's last part, with more after
    /// the chunks read, goes on after them.
    #[test]
    fn a_page_whose_chunks_all_fit_goes_on_after_them_when_more_follow() {
        let id = SessionId(1);
        let page = TurnPage {
            turns: 1,
            turn: Some(turn_of(["a".to_owned(), "b".to_owned()].into_iter())),
            more: true,
        };
        let from = From {
            turn: Some(1),
            seq: 0,
            part: 1,
        };
        let answer = page_of(id, &page, from, 4096, 1024);
        assert_eq!(answer["chunks"].as_array().map(Vec::len), Some(1));
        assert_eq!(answer["next"], json!({ "turn": 1, "seq": 2, "part": 0 }));
    }

    /// Found from outside: a read from a part past its chunk's parts (a
    /// stale or mistyped cursor) skipped the chunk and could answer an
    /// empty page with `next: null`, which reads as the turn's end. One
    /// past the last part goes on at the next chunk; further is bad params.
    #[test]
    fn a_read_from_a_part_past_its_chunk_is_refused_and_one_past_the_last_goes_on() {
        let id = SessionId(1);
        let page = TurnPage {
            turns: 1,
            turn: Some(turn_of(["a".to_owned(), "tail".to_owned()].into_iter())),
            more: false,
        };
        let from = |seq, part| From {
            turn: Some(1),
            seq,
            part,
        };
        let answer = page_of(id, &page, from(0, 1), 4096, 1024);
        assert_eq!(answer["chunks"][0]["seq"], 1, "{answer}");
        for (seq, part) in [(0, 2), (0, 99), (1, 2)] {
            match super::page(id, &page, from(seq, part), 4096, 1024) {
                Err(e) => assert!(e.message.contains("past them"), "{}", e.message),
                Ok(answer) => panic!("from {seq}/{part}: {answer}"),
            }
        }
    }

    /// A turn's stored error, however long, is bounded as an error's
    /// message is elsewhere, and the page's bytes count it: the answer is
    /// within its page, chunks included.
    #[test]
    fn a_huge_turn_error_is_bounded_and_counted_in_the_page() {
        let id = SessionId(1);
        let (page_bytes, part_bytes) = (16 * 1024, 4 * 1024);
        for message in ["E".repeat(2_000_000), "\u{1}".repeat(600)] {
            let mut turn = turn_of((0..1000).map(|_| "x".repeat(100)));
            turn.outcome = Some(settle_runtime::Outcome::Failed);
            turn.error = Some(settle_runtime::TurnError::new(
                settle_runtime::TurnErrorKind::Provider,
                message.clone(),
            ));
            let answer = first_page(id, turn, page_bytes, part_bytes);
            let said = answer["error"]["message"].as_str().unwrap_or_default();
            assert!(said.chars().count() <= crate::excerpt::MAX_MESSAGE_CHARS);
            assert!(answer["chunks"].as_array().is_some_and(|c| !c.is_empty()));
            assert!(!answer["next"].is_null());
            // The frame, with the longest id a request may have.
            let frame = crate::protocol::result(
                &json!("\u{1f}".repeat(crate::protocol::MAX_ID_CHARS)),
                answer,
            );
            assert!(frame.len() <= page_bytes, "{} bytes", frame.len());
        }
    }

    /// The answer that reads `turn`, the session's only one, from its start.
    fn first_page(id: SessionId, turn: TurnRow, bytes: usize, part: usize) -> Value {
        let page = TurnPage {
            turns: 1,
            turn: Some(turn),
            more: true,
        };
        let from = From {
            turn: None,
            seq: 0,
            part: 0,
        };
        page_of(id, &page, from, bytes, part)
    }

    fn page_of(id: SessionId, page: &TurnPage, from: From, bytes: usize, part: usize) -> Value {
        match super::page(id, page, from, bytes, part) {
            Ok(answer) => answer,
            Err(error) => panic!("{error:?}"),
        }
    }
}
