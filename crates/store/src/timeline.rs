//! The timeline: every transition of a session with its time and cause, as
//! `settle show` prints it (SPEC §2, §7).
//!
//! It is kept in segments: one `timeline` row holds the transitions of one
//! session written together — by one batch of writes, or by recovery's
//! finalize — in order, as a JSON array of `[at, from, to, cause]` steps (`at` in
//! milliseconds since the UNIX epoch, `from` null for the registration). A
//! teardown batch thus writes one segment per session rather than one row
//! per transition. The segment a session's finalize writes is its last, and
//! is kept in the session's own row (`sessions.last_steps`, schema version
//! 8) rather than as a `timeline` row: reading the segments of a session in
//! id order, then that one, gives back every transition in order.

use diesel::prelude::*;
use settle_core::State;

use crate::conn::Db;
use crate::error::{Context, DbError, StoreError};
use crate::read::TimelineRow;
use crate::schema::timeline;
use crate::time::{from_millis, opt_word, word};

/// One transition, about to be written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Step<'a> {
    pub(crate) at: i64,
    pub(crate) from: Option<State>,
    pub(crate) to: State,
    pub(crate) cause: &'a str,
}

/// A segment as it is inserted: many per statement (its [`Insert`](crate::rows::Insert)).
pub(crate) struct Segment<'e> {
    pub(crate) session: i64,
    pub(crate) steps: &'e str,
}

crate::rows::params!(
    Segment<'e>,
    |r, out| crate::rows::bind!(out; diesel::sql_types::BigInt => &r.session, diesel::sql_types::Text => r.steps)
);

impl crate::rows::Insert for Segment<'_> {
    const HEAD: &'static str = "INSERT INTO timeline (session, steps) VALUES ";
    type Id = Segment<'static>;
}

/// Append `steps` to `out` as one segment's JSON.
pub(crate) fn encode<'a>(
    out: &mut Vec<u8>,
    steps: impl IntoIterator<Item = Step<'a>>,
) -> Result<(), StoreError> {
    out.push(b'[');
    for (k, step) in steps.into_iter().enumerate() {
        if k > 0 {
            out.push(b',');
        }
        let row = (
            step.at,
            step.from.map(State::as_str),
            step.to.as_str(),
            step.cause,
        );
        serde_json::to_writer(&mut *out, &row).map_err(|e| StoreError::Database {
            context: "encoding a timeline segment",
            source: DbError::new(e),
        })?;
    }
    out.push(b']');
    Ok(())
}

/// Append a segment of one step to session `session`'s timeline (recovery's
/// finalize, outside a batch).
pub(crate) fn record(db: Db<'_>, session: i64, step: Step<'_>) -> Result<(), StoreError> {
    let mut steps = Vec::with_capacity(64 + step.cause.len());
    encode(&mut steps, [step])?;
    let steps = segment_text(&steps)?;
    on_db!(db, |c| diesel::insert_into(timeline::table)
        .values((timeline::session.eq(session), timeline::steps.eq(steps)))
        .execute(c))
    .context("recording a timeline row")?;
    Ok(())
}

/// The text of an encoded segment (serde_json writes UTF-8).
pub(crate) fn segment_text(encoded: &[u8]) -> Result<&str, StoreError> {
    std::str::from_utf8(encoded).map_err(|e| StoreError::Database {
        context: "encoding a timeline segment",
        source: DbError::new(e),
    })
}

type StepColumns = (i64, Option<String>, String, String);

/// The transitions of one segment, in order.
pub(crate) fn decode(segment: &str, out: &mut Vec<TimelineRow>) -> Result<(), StoreError> {
    let corrupt = || StoreError::Corrupt {
        session: None,
        column: "timeline.steps",
        value: segment.chars().take(200).collect(),
    };
    let steps: Vec<StepColumns> = serde_json::from_str(segment).map_err(|_| corrupt())?;
    for (at, from, to, cause) in steps {
        out.push(TimelineRow {
            at: from_millis(at),
            from: opt_word("timeline.steps", from.as_deref())?,
            to: word("timeline.steps", &to)?,
            cause,
        });
    }
    Ok(())
}
