//! Conversions between Rust values and the columns' portable representations:
//! `SystemTime` ⇄ milliseconds since the UNIX epoch, ids ⇄ `BIGINT`, the
//! core's vocabulary ⇄ its lowercase spellings, JSON values ⇄ their text.

use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::Value;
use settle_core::{SessionId, State};

use crate::error::StoreError;

/// Milliseconds since the UNIX epoch (negative before it), saturating.
pub(crate) fn to_millis(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => i64::try_from(e.duration().as_millis()).map_or(i64::MIN, |m| -m),
    }
}

/// `at` as RFC 3339 UTC, to the millisecond: how every reader of the store
/// (`settle sessions --json`, `show`, the gateway's `sessions.list`) spells
/// a time. A time RFC 3339 cannot spell (before 1970, past the year 9999:
/// only a store changed by hand holds one) is written as what it is, in
/// milliseconds from the epoch, instead of failing the read.
pub fn rfc3339(at: SystemTime) -> String {
    /// 9999-12-31T23:59:59.999Z.
    const LAST_MS: u128 = 253_402_300_799_999;
    match at.duration_since(UNIX_EPOCH) {
        Ok(since) if since.as_millis() <= LAST_MS => {
            humantime::format_rfc3339_millis(at).to_string()
        }
        Ok(since) => format!("(not a time: {} ms after 1970)", since.as_millis()),
        Err(before) => format!(
            "(not a time: {} ms before 1970)",
            before.duration().as_millis()
        ),
    }
}

/// The instant `ms` milliseconds after (or before) the UNIX epoch.
pub(crate) fn from_millis(ms: i64) -> SystemTime {
    let d = Duration::from_millis(ms.unsigned_abs());
    if ms >= 0 {
        UNIX_EPOCH + d
    } else {
        UNIX_EPOCH - d
    }
}

/// A duration in milliseconds, saturating.
pub(crate) fn duration_millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A session id as the database stores it.
pub(crate) fn sid(id: SessionId) -> Result<i64, StoreError> {
    i64::try_from(id.get()).map_err(|_| StoreError::OutOfRange {
        what: "session id",
        value: id.get(),
    })
}

/// A session id to look up: one past the database's range names no
/// session (none can have it), and is answered as an unknown one.
pub(crate) fn known_sid(id: SessionId) -> Result<i64, StoreError> {
    i64::try_from(id.get()).map_err(|_| StoreError::UnknownSession(id))
}

/// A session id read from the database (ids are allocated positive): a
/// negative one, which settle never writes, is a value it does not
/// understand, not another session's id read as positive.
pub(crate) fn session_id(raw: i64) -> Result<SessionId, StoreError> {
    u64::try_from(raw)
        .map(SessionId)
        .map_err(|_| StoreError::Corrupt {
            session: None,
            column: "sessions.id",
            value: raw.to_string(),
        })
}

/// A turn number read from the database, which only ever holds `u32`s.
pub(crate) fn turn_no(raw: i64) -> Result<u32, StoreError> {
    u32::try_from(raw).map_err(|_| StoreError::Corrupt {
        session: None,
        column: "turn number",
        value: raw.to_string(),
    })
}

/// The states `keep` admits as an SQL list of their spellings
/// (`'registered', 'running'`), in the vocabulary's order: SQL text that
/// names states takes them from here, never spelled by hand.
pub(crate) fn sql_states(keep: impl Fn(State) -> bool) -> String {
    State::ALL
        .iter()
        .filter(|s| keep(**s))
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Parse one of the core's words from a column.
pub(crate) fn word<T: FromStr>(column: &'static str, raw: &str) -> Result<T, StoreError> {
    raw.parse().map_err(|_| StoreError::Corrupt {
        session: None,
        column,
        value: raw.to_owned(),
    })
}

/// Parse an optional word from a nullable column.
pub(crate) fn opt_word<T: FromStr>(
    column: &'static str,
    raw: Option<&str>,
) -> Result<Option<T>, StoreError> {
    raw.map(|r| word(column, r)).transpose()
}

/// A JSON value as its column holds it: compact text.
pub(crate) fn json_text(value: &Value) -> String {
    value.to_string()
}

/// A JSON value read from a nullable text column.
pub(crate) fn json_value(
    column: &'static str,
    raw: Option<String>,
) -> Result<Option<Value>, StoreError> {
    raw.map(|text| {
        serde_json::from_str(&text).map_err(|_| StoreError::Corrupt {
            session: None,
            column,
            value: text,
        })
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_states_spell_each_state_as_the_vocabulary_does() {
        assert_eq!(
            sql_states(|s| s != State::Finalized),
            "'registered', 'running', 'cancelling', 'settled'"
        );
        assert_eq!(sql_states(|_| false), "");
    }
}
