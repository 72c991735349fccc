//! Reads for the command line and for tests: one session's turns, transcript
//! and timeline, and its committed memory. Each read sees one snapshot of the
//! database. Listing sessions lives in [`list`](crate::list).

use std::collections::HashMap;
use std::time::SystemTime;

use diesel::prelude::*;
use serde_json::Value;
use settle_core::{ChunkKind, EndReason, Outcome, SessionId, State, TurnError, TurnErrorKind};

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::input::TurnInput;
use crate::schema::{chunks, memories, owners, sessions, timeline, turns};
use crate::time::{from_millis, json_value, known_sid, opt_word, session_id, turn_no, word};

/// One session, with exactly the fields `settle sessions --json` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionRow {
    /// Its id.
    pub id: SessionId,
    /// Its name.
    pub name: String,
    /// Its parent, if it is not a root.
    pub parent: Option<SessionId>,
    /// Its lifecycle state.
    pub state: State,
    /// The outcome of its last turn or of its work, if any.
    pub outcome: Option<Outcome>,
    /// Why it was finalized, once it is.
    pub end_reason: Option<EndReason>,
    /// How many turns it started.
    pub turns: u64,
    /// How many chunks its transcript holds.
    pub chunks: u64,
    /// When it was registered.
    pub created_at: SystemTime,
    /// When it was finalized, once it is.
    pub finalized_at: Option<SystemTime>,
    /// The session it continues, if it was resumed.
    pub resumed_from: Option<SessionId>,
    /// Where clients reach the live process that owns it (its advertised
    /// URL, SPEC §12); `None` when it is finalized, released, or its owner
    /// advertised nothing or lost its lease.
    pub owner: Option<String>,
}

impl SessionRow {
    /// The row as `settle sessions --json` (and the gateway's
    /// `sessions.list`) spell it, SPEC §7: ids as numbers, words as their
    /// spellings, times in RFC 3339 (or null).
    pub fn to_json(&self) -> Value {
        let time = crate::time::rfc3339;
        serde_json::json!({
            "id": self.id.get(),
            "name": self.name,
            "parent": self.parent.map(SessionId::get),
            "state": self.state.as_str(),
            "outcome": self.outcome.map(Outcome::as_str),
            "end_reason": self.end_reason.map(EndReason::as_str),
            "turns": self.turns,
            "chunks": self.chunks,
            "created_at": time(self.created_at),
            "finalized_at": self.finalized_at.map(time),
            "resumed_from": self.resumed_from.map(SessionId::get),
            "owner": self.owner,
        })
    }
}

/// One turn of a session, with its transcript: what it was sent, what came
/// back, how it ended and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnRow {
    /// Its number within the session.
    pub no: u32,
    /// How it ended, once it has.
    pub outcome: Option<Outcome>,
    /// When it started.
    pub started_at: SystemTime,
    /// When it ended, once it has.
    pub ended_at: Option<SystemTime>,
    /// What it sent to the provider, as the store keeps it: everything, or
    /// the messages it added to the conversation ([`TurnInput`]; rebuild what
    /// it was sent with [`Conversation`](crate::Conversation)). `None` when
    /// none was recorded, as for turns written before inputs were kept.
    pub input: Option<TurnInput>,
    /// Why it failed, when it did and the reason was given.
    pub error: Option<TurnError>,
    /// Its chunks, in order, text and structured.
    pub chunks: Vec<ChunkRow>,
}

impl TurnRow {
    /// The reply as one text: its text chunks joined in order.
    pub fn text(&self) -> String {
        self.chunks
            .iter()
            .filter(|c| c.kind == ChunkKind::Text)
            .map(|c| c.text.as_str())
            .collect()
    }
}

/// One chunk of a turn's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkRow {
    /// Its position in the turn, from 0.
    pub seq: u32,
    /// What it carries.
    pub kind: ChunkKind,
    /// Its text.
    pub text: String,
    /// Its structured payload, if any.
    pub data: Option<Value>,
}

/// One recorded transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimelineRow {
    /// When it happened.
    pub at: SystemTime,
    /// The state left (`None` for the registration itself).
    pub from: Option<State>,
    /// The state entered.
    pub to: State,
    /// Why, in words.
    pub cause: String,
}

/// Everything `settle show ID` prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionDetail {
    /// The session's row.
    pub session: SessionRow,
    /// Its turns, in order, with their chunks.
    pub turns: Vec<TurnRow>,
    /// Its transitions, in order.
    pub timeline: Vec<TimelineRow>,
    /// Finalize steps that failed, as recorded when it was finalized.
    pub finalize_errors: Option<String>,
}

/// One committed memory row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRow {
    /// The completed turn it was built from.
    pub turn: u32,
    /// The turn's chunks, joined in order.
    pub content: String,
}

pub(crate) type SessionColumns = (
    i64,
    String,
    Option<i64>,
    String,
    Option<String>,
    Option<String>,
    i64,
    Option<i64>,
    Option<i64>,
);

type SessionSelect = (
    sessions::id,
    sessions::name,
    sessions::parent,
    sessions::state,
    sessions::outcome,
    sessions::end_reason,
    sessions::created_at,
    sessions::finalized_at,
    sessions::resumed_from,
);

pub(crate) const SESSION_COLUMNS: SessionSelect = (
    sessions::id,
    sessions::name,
    sessions::parent,
    sessions::state,
    sessions::outcome,
    sessions::end_reason,
    sessions::created_at,
    sessions::finalized_at,
    sessions::resumed_from,
);

pub(crate) fn session_row(
    cols: SessionColumns,
    turns: u64,
    chunks: u64,
) -> Result<SessionRow, StoreError> {
    let (id, name, parent, state, outcome, end_reason, created_at, finalized_at, resumed_from) =
        cols;
    let row = || -> Result<SessionRow, StoreError> {
        Ok(SessionRow {
            id: session_id(id)?,
            name,
            parent: parent.map(session_id).transpose()?,
            state: word("sessions.state", &state)?,
            outcome: opt_word("sessions.outcome", outcome.as_deref())?,
            end_reason: opt_word("sessions.end_reason", end_reason.as_deref())?,
            turns,
            chunks,
            created_at: from_millis(created_at),
            finalized_at: finalized_at.map(from_millis),
            resumed_from: resumed_from.map(session_id).transpose()?,
            owner: None,
        })
    };
    row().map_err(|e| e.of_session(id))
}

pub(crate) type TurnColumns = (
    i64,
    Option<String>,
    i64,
    Option<i64>,
    (Option<String>, Option<i64>),
    Option<String>,
    Option<String>,
);
type TurnSelect = (
    turns::no,
    turns::outcome,
    turns::started_at,
    turns::ended_at,
    (turns::input, turns::input_from),
    turns::error_kind,
    turns::error_message,
);
/// The columns of a turn's row that [`turn_row`] reads.
pub(crate) const TURN_COLUMNS: TurnSelect = (
    turns::no,
    turns::outcome,
    turns::started_at,
    turns::ended_at,
    (turns::input, turns::input_from),
    turns::error_kind,
    turns::error_message,
);
pub(crate) type ChunkColumns = (i64, i64, String, String, Option<String>);
type ChunkSelect = (
    chunks::turn_no,
    chunks::seq,
    chunks::kind,
    chunks::text,
    chunks::data,
);
/// The columns of a chunk's row that [`chunk_row`] reads.
pub(crate) const CHUNK_COLUMNS: ChunkSelect = (
    chunks::turn_no,
    chunks::seq,
    chunks::kind,
    chunks::text,
    chunks::data,
);

/// How a finalized session ended the turn its finalize carried the end of
/// (schema version 8): a finalized session's turn whose row has no end
/// ended at the session's finalize, with the session's outcome. (A finalize
/// closes every turn still open, so before that version every turn of a
/// finalized session had an end in its row.)
#[derive(Debug, Clone, Copy)]
pub(crate) struct EndedWith {
    outcome: Option<Outcome>,
    at: SystemTime,
}

impl EndedWith {
    /// How a session ended its turns, from its `state`, `outcome` and
    /// `finalized_at` columns, if it is finalized.
    pub(crate) fn columns(
        (state, outcome, finalized_at): (String, Option<String>, Option<i64>),
    ) -> Result<Option<EndedWith>, StoreError> {
        let finalized =
            word::<settle_core::State>("sessions.state", &state)? == settle_core::State::Finalized;
        Ok(match (finalized, finalized_at) {
            (true, Some(at)) => Some(EndedWith {
                outcome: opt_word("sessions.outcome", outcome.as_deref())?,
                at: from_millis(at),
            }),
            _ => None,
        })
    }

    /// How `session` ended its turns, if it is finalized.
    pub(crate) fn session(session: &SessionRow) -> Option<EndedWith> {
        let at = session.finalized_at?;
        (session.state == settle_core::State::Finalized).then_some(EndedWith {
            outcome: session.outcome,
            at,
        })
    }
}

/// A turn from its row's [`TURN_COLUMNS`], with `chunks`; `ended_with` says
/// how its session ended, if it is finalized (see [`EndedWith`]).
pub(crate) fn turn_row(
    cols: TurnColumns,
    chunks: Vec<ChunkRow>,
    ended_with: Option<EndedWith>,
) -> Result<TurnRow, StoreError> {
    let (no, outcome, started_at, ended_at, input, error_kind, error_message) = cols;
    let (outcome, ended_at) = match (ended_at, ended_with) {
        (None, Some(with)) => (with.outcome, Some(with.at)),
        (ended_at, _) => (
            opt_word("turns.outcome", outcome.as_deref())?,
            ended_at.map(from_millis),
        ),
    };
    Ok(TurnRow {
        no: turn_no(no)?,
        outcome,
        started_at: from_millis(started_at),
        ended_at,
        input: turn_input(input)?,
        error: turn_error(error_kind, error_message)?,
        chunks,
    })
}

/// A chunk from its row's [`CHUNK_COLUMNS`].
pub(crate) fn chunk_row((_, seq, kind, text, data): ChunkColumns) -> Result<ChunkRow, StoreError> {
    Ok(ChunkRow {
        seq: turn_no(seq)?,
        kind: word("chunks.kind", &kind)?,
        text,
        data: json_value("chunks.data", data)?,
    })
}

/// One session with its turns, transcript and timeline.
pub(crate) fn session_detail(mut db: Db<'_>, id: SessionId) -> Result<SessionDetail, StoreError> {
    let raw = known_sid(id)?;
    // An owner is shown while its lease is live, by the store's clock, as
    // in a listing.
    let now = crate::lease::store_now(db.reborrow())?;
    let (row, errors, owner, turn_rows, chunk_rows, timeline_rows) = read_tx!(db, |c| {
        let owner_url = owners::table
            .filter(owners::id.eq(sessions::owner))
            .filter(owners::lease_expires_at.gt(now))
            .select(owners::advertise)
            .single_value();
        type Read = (
            SessionColumns,
            Option<String>,
            Option<i64>,
            Option<String>,
            Option<String>,
        );
        let row: Option<Read> = sessions::table
            .find(raw)
            .select((
                SESSION_COLUMNS,
                sessions::finalize_errors,
                sessions::released_at,
                owner_url,
                // Its last segment (schema version 8).
                diesel::dsl::sql::<diesel::sql_types::Nullable<diesel::sql_types::Text>>(
                    "(SELECT last_segments.steps FROM last_segments \
                     WHERE last_segments.id = sessions.last_segment)",
                ),
            ))
            .first(c)
            .optional()
            .context("reading a session")?;
        let Some((row, errors, released_at, owner, last_segment)) = row else {
            return Err(StoreError::UnknownSession(id));
        };
        let owner = owner.filter(|_| released_at.is_none());
        let turn_rows: Vec<TurnColumns> = turns::table
            .filter(turns::session.eq(raw))
            .order(turns::no.asc())
            .select(TURN_COLUMNS)
            .load(c)
            .context("reading turns")?;
        let chunk_rows: Vec<ChunkColumns> = chunks::table
            .filter(chunks::session.eq(raw))
            .order((chunks::turn_no.asc(), chunks::seq.asc()))
            .select(CHUNK_COLUMNS)
            .load(c)
            .context("reading the transcript")?;
        // Its segments in order, then the last one, kept in its row.
        let mut timeline_rows: Vec<String> = timeline::table
            .filter(timeline::session.eq(raw))
            .order(timeline::id.asc())
            .select(timeline::steps)
            .load(c)
            .context("reading the timeline")?;
        timeline_rows.extend(last_segment);
        Ok::<_, StoreError>((row, errors, owner, turn_rows, chunk_rows, timeline_rows))
    })?;

    let mut by_turn: HashMap<i64, Vec<ChunkRow>> = HashMap::new();
    let chunk_count = chunk_rows.len() as u64;
    for cols in chunk_rows {
        let turn = cols.0;
        by_turn.entry(turn).or_default().push(chunk_row(cols)?);
    }
    let mut session = session_row(row, turn_rows.len() as u64, chunk_count)?;
    let ended_with = EndedWith::session(&session);
    let turns = turn_rows
        .into_iter()
        .map(|cols| {
            let chunks = by_turn.remove(&cols.0).unwrap_or_default();
            turn_row(cols, chunks, ended_with)
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    let mut timeline = Vec::with_capacity(timeline_rows.len());
    for segment in &timeline_rows {
        crate::timeline::decode(segment, &mut timeline)?;
    }
    if session.state != settle_core::State::Finalized {
        session.owner = owner;
    }
    Ok(SessionDetail {
        session,
        turns,
        timeline,
        finalize_errors: errors,
    })
}

/// A turn's input from its two columns: the messages stored, and where in
/// the conversation they begin (NULL: they are all it was sent).
fn turn_input(
    (messages, from): (Option<String>, Option<i64>),
) -> Result<Option<TurnInput>, StoreError> {
    let Some(messages) = json_value("turns.input", messages)? else {
        return Ok(None);
    };
    let continues = match from {
        None => None,
        Some(from) => Some(u32::try_from(from).map_err(|_| StoreError::Corrupt {
            session: None,
            column: "turns.input_from",
            value: from.to_string(),
        })?),
    };
    Ok(Some(TurnInput {
        messages,
        continues,
    }))
}

/// A turn's error from its two columns: a kind, and a message (empty if
/// none was stored).
fn turn_error(
    kind: Option<String>,
    message: Option<String>,
) -> Result<Option<TurnError>, StoreError> {
    let Some(kind) = kind else { return Ok(None) };
    let kind: TurnErrorKind = word("turns.error_kind", &kind)?;
    Ok(Some(TurnError::new(kind, message.unwrap_or_default())))
}

/// The memory committed for session `id`, in commit order.
pub(crate) fn memories(db: Db<'_>, id: SessionId) -> Result<Vec<MemoryRow>, StoreError> {
    let raw = known_sid(id)?;
    let rows: Vec<(i64, String)> = on_db!(db, |c| memories::table
        .filter(memories::session.eq(raw))
        .order(memories::id.asc())
        .select((memories::turn_no, memories::content))
        .load(c))
    .context("reading memory")?;
    rows.into_iter()
        .map(|(turn, content)| {
            Ok(MemoryRow {
                turn: turn_no(turn)?,
                content,
            })
        })
        .collect()
}
