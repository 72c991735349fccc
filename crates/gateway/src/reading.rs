//! `session.read`: what a turn of a session streamed, read back from the
//! store, for a client that was not attached (it reconnected, or joined
//! late) or missed notifications. Chunks come from a given `seq` (and part),
//! cut in parts as the notifications cut them, a page at a time: an answer
//! never outgrows a frame, and its `next` says where the next page starts.

use serde_json::{json, Value};
use settle_runtime::SessionId;
use settle_store::{ChunkKind, SessionDetail};

use crate::parts::{self, Payload};
use crate::protocol::RpcError;

/// Where a read starts: a turn (its number; the last when `None`), a
/// chunk's `seq` in it and a part of that chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct From {
    pub turn: Option<u32>,
    pub seq: u32,
    pub part: u32,
}

/// What the answer has besides its chunks.
const ENVELOPE_BYTES: usize = 512;

/// The answer to `session.read` of `detail` from `from`: the turn's number,
/// outcome and error, how many turns the session has, its chunks from
/// `from` within `page_bytes`, each part within `part_bytes`, and where the
/// next page starts (null once the read reached the turn's last chunk).
pub(crate) fn page(
    detail: &SessionDetail,
    from: From,
    page_bytes: usize,
    part_bytes: usize,
) -> Result<Value, RpcError> {
    let id: SessionId = detail.session.id;
    let count = detail.turns.len();
    let turn = match from.turn {
        None => detail.turns.last(),
        Some(no) => Some(detail.turns.iter().find(|t| t.no == no).ok_or_else(|| {
            RpcError::bad_params(format!("session {id} has no turn {no}; it has {count}"))
        })?),
    };
    let Some(turn) = turn else {
        return Ok(json!({
            "id": id.get(), "turns": 0, "turn": null, "outcome": null, "error": null,
            "chunks": [], "next": null,
        }));
    };
    let budget = page_bytes.saturating_sub(ENVELOPE_BYTES);
    let mut chunks = Vec::new();
    let mut bytes = 0usize;
    let mut next = Value::Null;
    'rows: for row in turn.chunks.iter().filter(|c| c.seq >= from.seq) {
        let payload = match (row.kind, &row.data) {
            (ChunkKind::Text, _) | (_, None) => Payload::Text(&row.text),
            (kind, Some(data)) => Payload::Data {
                kind: kind.as_str(),
                json: data,
            },
        };
        let first = if row.seq == from.seq { from.part } else { 0 };
        let parts = parts::params(id, turn.no, row.seq, payload, part_bytes);
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
    let error = turn.error.as_ref().map_or(
        Value::Null,
        |e| json!({ "kind": e.kind.as_str(), "message": e.message }),
    );
    Ok(json!({
        "id": id.get(),
        "turns": count,
        "turn": turn.no,
        "outcome": turn.outcome.map(|o| o.as_str()),
        "error": error,
        "chunks": chunks,
        "next": next,
    }))
}
