//! Transcript chunks: what an append takes and returns, and how one batch of
//! appends is committed.
//!
//! A chunk is text, or a structured event (a tool call, reasoning, usage) with
//! a JSON payload beside its text: both persist the same way (G7).
//!
//! A batch is committed atomically. Its chunks are grouped by turn; each
//! group takes the next sequence numbers of its turn, only while the turn
//! is open, its session not finalized and its owner's lease live by the
//! store's clock, and the accepted chunks of all groups are inserted
//! together. On SQLite that is one transaction: one point read per turn,
//! which finds the turn open and its highest number in its chunks' own
//! key, then the insert; the turn's row is not written. On PostgreSQL it is
//! one statement, a round trip per batch, which claims the numbers from the
//! turn's `next_seq`. A refused group is answered with the reason; the rest
//! of the batch still commits. A chunk is acknowledged only after the
//! commit.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context as TaskContext, Poll};

use diesel::prelude::*;
use diesel::sql_types::{BigInt, Nullable, Text};
use serde_json::Value;
use settle_core::{ChunkKind, SessionId, State};
use tokio::sync::oneshot;

use crate::conn::Db;
use crate::error::{Context, StoreError};
use crate::lease::store_now;
use crate::rows::{bind, insert_rows, params, pieces, Insert};
use crate::session::why_turn_refused;
use crate::time::{json_text, sid, sql_states};

/// Maps keyed by turn: foldhash on the append path.
type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// One chunk of a turn's output, as [`append_chunk`](crate::SessionStore::append_chunk)
/// takes it. A `String` converts into a text chunk.
///
/// ```
/// use serde_json::json;
/// use settle_store::{ChunkKind, NewChunk};
///
/// let text: NewChunk = "Hello".to_owned().into();
/// assert_eq!(text.kind, ChunkKind::Text);
/// let call = NewChunk::structured(ChunkKind::ToolCall, json!({"name": "scan", "arguments": {"port": 22}}));
/// assert_eq!(call.text, "");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewChunk {
    /// What it carries.
    pub kind: ChunkKind,
    /// Its text: the reply's words for a text chunk, optional for the others.
    pub text: String,
    /// Its structured payload, if any.
    pub data: Option<Value>,
}

impl NewChunk {
    /// A piece of the reply's text.
    pub fn text(text: impl Into<String>) -> Self {
        NewChunk {
            kind: ChunkKind::Text,
            text: text.into(),
            data: None,
        }
    }

    /// A structured chunk of `kind` carrying `data`, with no text.
    pub fn structured(kind: ChunkKind, data: Value) -> Self {
        NewChunk {
            kind,
            text: String::new(),
            data: Some(data),
        }
    }

    /// Give it `text` as well.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.text = text.into();
        self
    }
}

impl From<String> for NewChunk {
    fn from(text: String) -> Self {
        NewChunk::text(text)
    }
}

impl From<&str> for NewChunk {
    fn from(text: &str) -> Self {
        NewChunk::text(text)
    }
}

/// The acknowledgement of a chunk: it is committed and survives a crash (G7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChunkAck {
    /// The session written to.
    pub session: SessionId,
    /// The turn written to.
    pub turn: u32,
    /// The chunk's position in its turn, from 0, in append order.
    pub seq: u32,
}

/// The future of one appended chunk: resolves to its [`ChunkAck`] once it is
/// committed, or to the reason it was refused.
///
/// The chunk is queued when [`append_chunk`](crate::SessionStore::append_chunk)
/// is called, not when this is first polled, so appends keep their call order
/// whether or not each receipt is awaited before the next append. Dropping the
/// receipt does not withdraw the chunk.
#[derive(Debug)]
#[must_use = "a chunk is only known to be persisted once its receipt resolves"]
pub struct ChunkReceipt {
    state: Receipt,
}

#[derive(Debug)]
enum Receipt {
    Pending(oneshot::Receiver<Result<ChunkAck, StoreError>>),
    Ready(Option<Result<ChunkAck, StoreError>>),
}

impl ChunkReceipt {
    /// A receipt that is already resolved, for stores that persist synchronously
    /// (or stubs in tests and benchmarks).
    pub fn ready(result: Result<ChunkAck, StoreError>) -> Self {
        ChunkReceipt {
            state: Receipt::Ready(Some(result)),
        }
    }

    /// A receipt answered through `rx`, for a store that commits on a
    /// thread of its own (a receipt whose sender is dropped unanswered
    /// resolves to [`StoreError::Unavailable`]).
    pub fn pending(rx: oneshot::Receiver<Result<ChunkAck, StoreError>>) -> Self {
        ChunkReceipt {
            state: Receipt::Pending(rx),
        }
    }
}

impl Future for ChunkReceipt {
    type Output = Result<ChunkAck, StoreError>;

    fn poll(self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match &mut self.get_mut().state {
            Receipt::Pending(rx) => Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or(Err(StoreError::Unavailable))),
            Receipt::Ready(r) => Poll::Ready(r.take().unwrap_or(Err(StoreError::Unavailable))),
        }
    }
}

/// A chunk waiting in the writer's queue.
#[derive(Debug)]
pub(crate) struct PendingChunk {
    pub(crate) session: SessionId,
    pub(crate) turn: u32,
    pub(crate) chunk: NewChunk,
    pub(crate) ack: oneshot::Sender<Result<ChunkAck, StoreError>>,
}

struct ChunkInsert<'a> {
    session: i64,
    turn_no: i64,
    seq: i64,
    text: &'a str,
    kind: &'static str,
    data: Option<String>,
}

impl Insert for ChunkInsert<'_> {
    const HEAD: &'static str =
        "INSERT INTO chunks (session, turn_no, seq, \"text\", kind, data) VALUES ";
    type Id = ChunkInsert<'static>;
}

params!(ChunkInsert<'a>, |r, out| bind!(out;
    BigInt => &r.session, BigInt => &r.turn_no, BigInt => &r.seq, Text => r.text,
    Text => r.kind, Nullable<Text> => &r.data));

/// SQLite: the next sequence number of turn `no` of `session` (one past
/// the highest of its chunks, 0 for none), only while the turn is open, its
/// session not finalized and its owner's lease live by `now` (the store's
/// clock); no row when the turn is refused. Its parameters: `[session, no,
/// now]`.
///
/// Read in the writer's write transaction, whose chunk insert takes the
/// numbers: SQLite has one writer at a time, so the read and the insert are
/// one step, and the number comes from the chunks' own key (its last entry
/// for the turn, one seek). The turn's row is not written. Claiming the
/// numbers from `turns.next_seq`, as PostgreSQL does for its concurrent
/// writers, rewrote that row in every transaction: one more page of the
/// write-ahead log per commit, half again what the chunk's own insert
/// writes.
///
/// One point statement per turn at every batch size: with nothing to
/// update, a set-wise statement (`… FROM (VALUES …)`) saves nothing over it
/// and makes SQLite build a temporary b-tree on every execution.
struct NextSeq {
    params: [i64; 3],
}

/// SQLite: a turn takes chunks while it is open, its session is not
/// finalized and its owner's lease is live by the time bound after this
/// text. A session's state is one of the lifecycle's words (the column's
/// `CHECK`), so "not finalized" is one comparison, where an `IN` list of the
/// other four made SQLite build a temporary b-tree on every execution.
static TAKES_CHUNKS: LazyLock<String> = LazyLock::new(|| {
    format!(
        " AND turns.ended_at IS NULL AND EXISTS (SELECT 1 FROM sessions \
         WHERE sessions.id = turns.session AND sessions.state <> '{}' \
         AND EXISTS (SELECT 1 FROM owners WHERE owners.id = sessions.owner \
         AND owners.lease_expires_at > ",
        State::Finalized.as_str()
    )
});

/// The text of [`NextSeq`]: what comes before each parameter, and the rest.
static NEXT_SEQ: LazyLock<[String; 4]> = LazyLock::new(|| {
    [
        "SELECT COALESCE((SELECT MAX(chunks.seq) FROM chunks \
         WHERE chunks.session = turns.session AND chunks.turn_no = turns.\"no\"), -1) + 1 \
         FROM turns WHERE turns.session = "
            .to_owned(),
        " AND turns.\"no\" = ".to_owned(),
        TAKES_CHUNKS.clone(),
        "))".to_owned(),
    ]
});

// Generic only because the transaction macro names both backends; it runs
// on SQLite (PostgreSQL appends with `AppendPg`).
impl<DB> diesel::query_builder::QueryFragment<DB> for NextSeq
where
    DB: diesel::backend::Backend + diesel::sql_types::HasSqlType<BigInt>,
    i64: diesel::serialize::ToSql<BigInt, DB>,
{
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, DB>,
    ) -> diesel::QueryResult<()> {
        for (before, param) in NEXT_SEQ.iter().zip(&self.params) {
            out.push_sql(before);
            out.push_bind_param::<BigInt, _>(param)?;
        }
        out.push_sql(&NEXT_SEQ[3]);
        Ok(())
    }
}

// One text, so one prepared statement kept by its type.
impl diesel::query_builder::QueryId for NextSeq {
    type QueryId = NextSeq;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for NextSeq {
    type SqlType = BigInt;
}

impl<Conn> RunQueryDsl<Conn> for NextSeq {}

/// The chunks of one batch grouped by turn, in order of first appearance;
/// within a group, in append order.
type Groups = Vec<((SessionId, u32), Vec<usize>)>;

/// What a committed batch answers each of its chunks, in batch order.
type Answers = Vec<Option<Result<ChunkAck, StoreError>>>;

/// Commit `batch` and answer every chunk in it. Returns whether the write
/// failed.
///
/// On PostgreSQL the batch is one statement ([`AppendPg`]): the store's
/// clock, the reservation and the insert in one round trip, where doing them
/// in turn inside a transaction took five (`BEGIN`, the clock, the
/// reservation, the insert, `COMMIT`). On SQLite the statements run in
/// process, and the batch is one transaction of two of them.
pub(crate) fn commit_batch(db: Db<'_>, batch: Vec<PendingChunk>) -> bool {
    let mut groups: Groups = Vec::new();
    for (i, chunk) in batch.iter().enumerate() {
        let key = (chunk.session, chunk.turn);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, members)) => members.push(i),
            None => groups.push((key, vec![i])),
        }
    }
    let committed = match db {
        Db::Pg(c) => commit_pg(c, &batch, &groups),
        db => commit_in_steps(db, &batch, &groups),
    };
    match committed {
        Ok(answers) => {
            for (chunk, answer) in batch.into_iter().zip(answers) {
                // A dropped receipt only means nobody waits for the answer.
                let _ = chunk
                    .ack
                    .send(answer.unwrap_or(Err(StoreError::Unavailable)));
            }
            false
        }
        Err(e) => {
            tracing::warn!(error = %e, chunks = batch.len(), "a batch of chunks was not committed");
            for chunk in batch {
                let _ = chunk.ack.send(Err(e.clone()));
            }
            true
        }
    }
}

/// Each group's `(session, turn, n)`: how many numbers it claims.
fn wanted(groups: &Groups) -> Result<Vec<(i64, i64, i64)>, StoreError> {
    groups
        .iter()
        .map(|((session, turn), members)| {
            let n = i64::try_from(members.len()).unwrap_or(i64::MAX);
            Ok((sid(*session)?, i64::from(*turn), n))
        })
        .collect()
}

/// The answers of a batch whose accepted groups' ranges end as `ends` says
/// (keyed by `(session, turn)`); every other group gets what `refused` says.
fn answers(
    batch: &[PendingChunk],
    groups: &Groups,
    ends: &HashMap<(i64, i64), i64>,
    mut refused: impl FnMut(SessionId, u32) -> Result<StoreError, StoreError>,
) -> Result<Answers, StoreError> {
    let mut answers: Answers = (0..batch.len()).map(|_| None).collect();
    for ((session, turn), members) in groups {
        let end = ends.get(&(sid(*session)?, i64::from(*turn)));
        let Some(&end) = end else {
            let why = refused(*session, *turn)?;
            for &i in members {
                answers[i] = Some(Err(why.clone()));
            }
            continue;
        };
        let n = i64::try_from(members.len()).unwrap_or(i64::MAX);
        for (&i, seq) in members.iter().zip(end - n..) {
            answers[i] = Some(match u32::try_from(seq) {
                Ok(seq) => Ok(ChunkAck {
                    session: *session,
                    turn: *turn,
                    seq,
                }),
                Err(_) => Err(StoreError::OutOfRange {
                    what: "chunk sequence number",
                    value: seq.unsigned_abs(),
                }),
            });
        }
    }
    Ok(answers)
}

/// One transaction: the clock, each turn's next number ([`NextSeq`]), then
/// one multi-row `INSERT` of the accepted chunks.
fn commit_in_steps(
    db: Db<'_>,
    batch: &[PendingChunk],
    groups: &Groups,
) -> Result<Answers, StoreError> {
    write_tx!(db, |c| {
        let now = store_now(Db::from(&mut *c))?;
        // Each accepted group's range ends `n` past its turn's next number.
        let wanted = wanted(groups)?;
        let mut ends: HashMap<(i64, i64), i64> = HashMap::default();
        for &(session, no, n) in &wanted {
            let next: Option<i64> = NextSeq {
                params: [session, no, now],
            }
            .get_result(c)
            .optional()
            .context("reading a turn's next chunk number")?;
            if let Some(next) = next {
                ends.insert((session, no), next.saturating_add(n));
            }
        }
        let mut rows: Vec<ChunkInsert<'_>> = Vec::with_capacity(batch.len());
        for (((_, turn), members), &(raw, no, n)) in groups.iter().zip(&wanted) {
            let Some(&end) = ends.get(&(raw, no)) else {
                continue;
            };
            for (&i, seq) in members.iter().zip(end - n..) {
                let chunk = &batch[i].chunk;
                rows.push(ChunkInsert {
                    session: raw,
                    turn_no: i64::from(*turn),
                    seq,
                    text: &chunk.text,
                    kind: chunk.kind.as_str(),
                    data: chunk.data.as_ref().map(json_text),
                });
            }
        }
        // Every accepted group in one multi-row INSERT (split under the bind
        // limits; a full batch is one prepared statement).
        for part in pieces(&rows) {
            insert_rows!(c, part).context("inserting chunks")?;
        }
        answers(batch, groups, &ends, |session, turn| {
            why_turn_refused(Db::from(&mut *c), session, turn, now)
        })
    })
}

/// The whole batch as one PostgreSQL statement ([`AppendPg`]), atomic on its
/// own. A refused group's reason is read after it, by the store's clock then:
/// the lifecycle only moves forward, so it reads as refused still.
fn commit_pg(
    c: &mut diesel::PgConnection,
    batch: &[PendingChunk],
    groups: &Groups,
) -> Result<Answers, StoreError> {
    let wanted = wanted(groups)?;
    let mut statement = AppendPg::default();
    for (((_, turn), members), &(raw, no, n)) in groups.iter().zip(&wanted) {
        statement.turn_session.push(raw);
        statement.turn_no.push(no);
        statement.turn_n.push(n);
        for (&i, k) in members.iter().zip(0_i64..) {
            let chunk = &batch[i].chunk;
            statement.session.push(raw);
            statement.no.push(i64::from(*turn));
            statement.k.push(k);
            statement.text.push(pg_text(&chunk.text));
            statement.kind.push(chunk.kind.as_str());
            statement.data.push(chunk.data.as_ref().map(json_text));
        }
    }
    let reserved: Vec<(i64, i64, i64)> = statement.load(c).context("appending chunks")?;
    let ends: HashMap<(i64, i64), i64> = reserved
        .into_iter()
        .map(|(s, no, end)| ((s, no), end))
        .collect();
    let mut now = None;
    answers(batch, groups, &ends, |session, turn| {
        let now = match now {
            Some(now) => now,
            None => *now.insert(store_now(Db::Pg(&mut *c))?),
        };
        why_turn_refused(Db::Pg(&mut *c), session, turn, now)
    })
}

/// A batch of chunks in one PostgreSQL statement, its text the same for
/// every batch (the rows are bound as arrays, so it stays prepared): claim
/// each turn's range with the checks [`NextSeq`] makes on SQLite, by the
/// server's clock, insert the chunks of the turns that got one at
/// `first + k`, and return the end of each range claimed. PostgreSQL runs a data-modifying `WITH` to completion
/// whether or not the query reads it, and the whole statement in one
/// snapshot.
#[derive(Default)]
struct AppendPg<'a> {
    turn_session: Vec<i64>,
    turn_no: Vec<i64>,
    turn_n: Vec<i64>,
    session: Vec<i64>,
    no: Vec<i64>,
    /// The chunk's place in its group, from 0.
    k: Vec<i64>,
    text: Vec<std::borrow::Cow<'a, str>>,
    kind: Vec<&'static str>,
    data: Vec<Option<String>>,
}

/// A chunk's text as PostgreSQL keeps it: its `text` holds no NUL
/// character (it refuses the whole statement, a batch of other sessions'
/// chunks with it), so a NUL a provider or a caller sent is kept as U+FFFD,
/// the replacement character; SQLite keeps it as it is.
fn pg_text(text: &str) -> std::borrow::Cow<'_, str> {
    match text.contains('\0') {
        true => std::borrow::Cow::Owned(text.replace('\0', "\u{fffd}")),
        false => std::borrow::Cow::Borrowed(text),
    }
}

/// [`AppendPg`]'s text up to each of its nine parameters, in order.
static APPEND_PG: LazyLock<[String; 10]> = LazyLock::new(|| {
    [
        "WITH v AS (SELECT * FROM unnest(".to_owned(),
        ", ".to_owned(),
        ", ".to_owned(),
        format!(
            ") AS v(s, t, n)), r AS (UPDATE turns SET next_seq = turns.next_seq + v.n \
             FROM v WHERE turns.session = v.s AND turns.\"no\" = v.t \
             AND turns.ended_at IS NULL AND EXISTS (SELECT 1 FROM sessions \
             WHERE sessions.id = turns.session AND sessions.state IN ({}) \
             AND EXISTS (SELECT 1 FROM owners WHERE owners.id = sessions.owner \
             AND owners.lease_expires_at > \
             (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::bigint)) \
             RETURNING turns.session, turns.\"no\", turns.next_seq, v.n), \
             i AS (INSERT INTO chunks (session, turn_no, seq, \"text\", kind, data) \
             SELECT c.s, c.t, r.next_seq - r.n + c.k, c.x, c.y, c.d FROM unnest(",
            sql_states(|s| s != State::Finalized)
        ),
        ", ".to_owned(),
        ", ".to_owned(),
        ", ".to_owned(),
        ", ".to_owned(),
        ", ".to_owned(),
        ") AS c(s, t, k, x, y, d) JOIN r ON r.session = c.s AND r.\"no\" = c.t) \
         SELECT session, \"no\", next_seq FROM r"
            .to_owned(),
    ]
});

impl diesel::query_builder::QueryFragment<diesel::pg::Pg> for AppendPg<'_> {
    fn walk_ast<'b>(
        &'b self,
        mut out: diesel::query_builder::AstPass<'_, 'b, diesel::pg::Pg>,
    ) -> diesel::QueryResult<()> {
        use diesel::sql_types::Array;
        let text = &*APPEND_PG;
        out.push_sql(&text[0]);
        out.push_bind_param::<Array<BigInt>, _>(&self.turn_session)?;
        out.push_sql(&text[1]);
        out.push_bind_param::<Array<BigInt>, _>(&self.turn_no)?;
        out.push_sql(&text[2]);
        out.push_bind_param::<Array<BigInt>, _>(&self.turn_n)?;
        out.push_sql(&text[3]);
        out.push_bind_param::<Array<BigInt>, _>(&self.session)?;
        out.push_sql(&text[4]);
        out.push_bind_param::<Array<BigInt>, _>(&self.no)?;
        out.push_sql(&text[5]);
        out.push_bind_param::<Array<BigInt>, _>(&self.k)?;
        out.push_sql(&text[6]);
        out.push_bind_param::<Array<Text>, _>(&self.text)?;
        out.push_sql(&text[7]);
        out.push_bind_param::<Array<Text>, _>(&self.kind)?;
        out.push_sql(&text[8]);
        out.push_bind_param::<Array<Nullable<Text>>, _>(&self.data)?;
        out.push_sql(&text[9]);
        Ok(())
    }
}

impl diesel::query_builder::QueryId for AppendPg<'_> {
    type QueryId = AppendPg<'static>;
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl diesel::query_builder::Query for AppendPg<'_> {
    type SqlType = (BigInt, BigInt, BigInt);
}

impl<Conn> RunQueryDsl<Conn> for AppendPg<'_> {}
