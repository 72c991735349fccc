//! The params of each method (SPEC §10), read strictly: a missing field, a
//! field of the wrong type or an unknown field is a `bad_request`, so that a
//! typo (`close_on_disconect`) is an error and not a silent default.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use settle_runtime::{Hold, SessionId, State};
use settle_store::ListCursor;

use crate::protocol::RpcError;

/// The longest session name accepted, in characters (the runtime's, for
/// every frontend).
pub const MAX_NAME_CHARS: usize = settle_runtime::MAX_NAME_CHARS;

/// Reads `params` as `T`.
pub(crate) fn read<T: DeserializeOwned>(params: Value) -> Result<T, RpcError> {
    serde_json::from_value(params).map_err(RpcError::bad_params)
}

/// `session.create`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Create {
    pub name: String,
    #[serde(default)]
    pub parent: Option<u64>,
    #[serde(default)]
    pub close_on_disconnect: bool,
}

impl Create {
    /// The name, checked: not blank, no NUL character, at most
    /// [`MAX_NAME_CHARS`].
    pub fn checked_name(&self) -> Result<&str, RpcError> {
        let chars = self.name.chars().count();
        if self.name.trim().is_empty() {
            return Err(RpcError::bad_params("`name` must not be blank"));
        }
        // PostgreSQL's text keeps no NUL: refused alike on every store.
        if self.name.contains('\0') {
            return Err(RpcError::bad_params(
                "`name` must not hold a NUL character (U+0000)",
            ));
        }
        if chars > MAX_NAME_CHARS {
            return Err(RpcError::bad_params(format!(
                "`name` is {chars} characters long; at most {MAX_NAME_CHARS} are accepted"
            )));
        }
        Ok(&self.name)
    }
}

/// The params of the methods about one session: `session.attach`,
/// `session.detach`, `turn.cancel`, `session.close`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Id {
    pub id: u64,
}

impl Id {
    pub fn session(&self) -> SessionId {
        SessionId(self.id)
    }
}

/// `turn.start`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TurnStart {
    pub id: u64,
    pub prompt: String,
}

/// `session.hold` and `session.release`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HoldParams {
    pub id: u64,
    pub hold: HoldWord,
}

/// What a hold waits on, as the protocol spells it.
#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum HoldWord {
    /// Input asked of a person (an approval prompt).
    Input,
    /// A delegation still outstanding.
    Delegation,
}

impl From<HoldWord> for Hold {
    fn from(word: HoldWord) -> Hold {
        match word {
            HoldWord::Input => Hold::PendingInput,
            HoldWord::Delegation => Hold::Delegation,
        }
    }
}

/// `session.read`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Read {
    pub id: u64,
    /// The turn; the last one when left out.
    #[serde(default)]
    pub turn: Option<u32>,
    /// The first chunk's `seq` (default 0).
    #[serde(default)]
    pub seq: u32,
    /// The first part of that chunk (default 0).
    #[serde(default)]
    pub part: u32,
}

/// `sessions.list`: the filters, and the place and size of the page.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct List {
    #[serde(default)]
    pub state: Option<String>,
    /// Only sessions registered at or after this time (RFC 3339).
    #[serde(default)]
    pub since: Option<String>,
    /// At most this many rows (default [`DEFAULT_PAGE_ROWS`], at most
    /// [`MAX_PAGE_ROWS`]).
    #[serde(default)]
    pub limit: Option<usize>,
    /// The `next_cursor` of the page before.
    #[serde(default)]
    pub cursor: Option<String>,
}

/// The rows of a `sessions.list` page when no `limit` is given.
pub(crate) const DEFAULT_PAGE_ROWS: usize = 100;

/// The most rows a `sessions.list` page has.
pub(crate) const MAX_PAGE_ROWS: usize = 1000;

impl List {
    /// The state asked for, checked against the vocabulary.
    pub fn checked_state(&self) -> Result<Option<State>, RpcError> {
        self.state
            .as_deref()
            .map(str::parse::<State>)
            .transpose()
            .map_err(RpcError::bad_params)
    }

    /// The time asked for, read as RFC 3339 (see [`rfc3339`]).
    pub fn checked_since(&self) -> Result<Option<SystemTime>, RpcError> {
        self.since
            .as_deref()
            .map(|since| {
                rfc3339(since).map_err(|e| {
                    RpcError::bad_params(format!(
                        "`since` must be an RFC 3339 time such as 2025-01-31T12:00:00Z \
                         or 2025-01-31T13:00:00+01:00: {e}"
                    ))
                })
            })
            .transpose()
    }

    /// The page size asked for, checked: 1 to [`MAX_PAGE_ROWS`].
    pub fn checked_limit(&self) -> Result<usize, RpcError> {
        match self.limit {
            None => Ok(DEFAULT_PAGE_ROWS),
            Some(n @ 1..=MAX_PAGE_ROWS) => Ok(n),
            Some(n) => Err(RpcError::bad_params(format!(
                "`limit` is {n}; a page has 1 to {MAX_PAGE_ROWS} rows"
            ))),
        }
    }

    /// The place the page starts after, read from a cursor this gateway gave.
    pub fn checked_cursor(&self) -> Result<Option<ListCursor>, RpcError> {
        self.cursor.as_deref().map(parse_cursor).transpose()
    }
}

/// Days in 400 years of the Gregorian calendar, after which its years
/// repeat, leap days included.
const DAYS_IN_400_YEARS: u64 = 146_097;

/// `text` read as an RFC 3339 time (RFC 3339 §5.6), the instant it names:
/// `YYYY-MM-DDTHH:MM:SS`, an optional fraction of a second, and the offset
/// `Z` or `+HH:MM`/`-HH:MM` (`T` and `Z` in either case), any year from
/// 0000. As before, a space for the `T` and a time without an offset (read
/// as UTC) are taken too.
///
/// `humantime` checks and reads the date and the time of day, in UTC and
/// from 1970 only: the offset is read here and applied after, and a year
/// before 1970 is read 400 years (or a multiple) later and moved back, the
/// Gregorian calendar being the same then.
fn rfc3339(text: &str) -> Result<SystemTime, String> {
    let shape = || {
        format!(
            "{} is not of the form YYYY-MM-DDTHH:MM:SS[.fraction] followed by Z or ±HH:MM",
            crate::excerpt::bounded(text, 64)
        )
    };
    let (local, east) = split_offset(text).ok_or_else(shape)?;
    let Some((head, rest)) = local.as_bytes().split_first_chunk::<19>() else {
        return Err(shape());
    };
    let [y1, y2, y3, y4, b'-', m1, m2, b'-', d1, d2, t, h1, h2, b':', n1, n2, b':', s1, s2] = *head
    else {
        return Err(shape());
    };
    let fraction = match rest {
        [] => true,
        [b'.', digits @ ..] => !digits.is_empty() && digits.iter().all(u8::is_ascii_digit),
        _ => false,
    };
    let numbers = [y1, y2, y3, y4, m1, m2, d1, d2, h1, h2, n1, n2, s1, s2];
    let between = matches!(t, b'T' | b't' | b' ');
    if !between || !fraction || !numbers.iter().all(u8::is_ascii_digit) {
        return Err(shape());
    }
    let year = [y1, y2, y3, y4]
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    let (Some(date), Some(time)) = (local.get(4..10), local.get(11..)) else {
        return Err(shape());
    };
    let shift = 1970u64.saturating_sub(year).div_ceil(400);
    let utc = format!("{:04}{date}T{time}Z", year + 400 * shift);
    let at = humantime::parse_rfc3339(&utc).map_err(|e| e.to_string())?;
    let back = Duration::from_secs(shift * DAYS_IN_400_YEARS * 24 * 60 * 60);
    let offset = Duration::from_secs(east.unsigned_abs());
    at.checked_sub(back)
        .and_then(|at| match east {
            0.. => at.checked_sub(offset),
            _ => at.checked_add(offset),
        })
        .ok_or_else(|| format!("{} is out of range", crate::excerpt::bounded(text, 64)))
}

/// `text` without its offset, and the offset in seconds east of UTC:
/// `Z` (or `z`) and `±HH:MM` (hours to 23, minutes to 59); no offset reads
/// as UTC. `None` for an offset out of range.
fn split_offset(text: &str) -> Option<(&str, i64)> {
    if let Some(local) = text.strip_suffix(['Z', 'z']) {
        return Some((local, 0));
    }
    let at = text.len().checked_sub(6);
    let tail = at.and_then(|at| text.as_bytes().get(at..));
    let Some(&[sign @ (b'+' | b'-'), h1, h2, b':', m1, m2]) = tail else {
        return Some((text, 0));
    };
    let two = |a: u8, b: u8| {
        (a.is_ascii_digit() && b.is_ascii_digit()).then(|| i64::from((a - b'0') * 10 + (b - b'0')))
    };
    let (hours, minutes) = (two(h1, h2)?, two(m1, m2)?);
    if hours > 23 || minutes > 59 {
        return None;
    }
    let east = (hours * 60 + minutes) * 60;
    let local = text.get(..at?)?;
    Some((local, if sign == b'-' { -east } else { east }))
}

/// A cursor as `sessions.list` gives it out: the registration time of the
/// page's last row in milliseconds since the epoch, a dot, its id. Opaque
/// to clients; spelled plainly so a person can read it in a log.
pub(crate) fn cursor(place: ListCursor) -> String {
    let ms = match place.created_at.duration_since(UNIX_EPOCH) {
        Ok(d) => i128::try_from(d.as_millis()).unwrap_or(i128::MAX),
        Err(e) => -i128::try_from(e.duration().as_millis()).unwrap_or(i128::MAX),
    };
    format!("{ms}.{}", place.id.get())
}

fn parse_cursor(text: &str) -> Result<ListCursor, RpcError> {
    let refused = || {
        RpcError::bad_params(format!(
            "`cursor` {} is not one sessions.list gave; pass its `next_cursor` as it is",
            crate::excerpt::bounded(text, 64)
        ))
    };
    let (ms, id) = text.split_once('.').ok_or_else(refused)?;
    let ms: i64 = ms.parse().map_err(|_| refused())?;
    let id: u64 = id.parse().map_err(|_| refused())?;
    let created_at = if ms >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_millis(ms.unsigned_abs()))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_millis(ms.unsigned_abs()))
    }
    .ok_or_else(refused)?;
    Ok(ListCursor {
        created_at,
        id: SessionId(id),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_misspelt_or_missing_field_is_refused() {
        assert!(read::<Create>(json!({"name": "a", "close_on_disconect": true})).is_err());
        assert!(read::<TurnStart>(json!({"id": 1})).is_err());
        assert!(read::<Id>(json!({"id": "1"})).is_err());
        assert!(read::<HoldParams>(json!({"id": 1, "hold": "lunch"})).is_err());
        let create: Create = read(json!({"name": "a"})).unwrap();
        assert!(!create.close_on_disconnect);
        assert_eq!(create.parent, None);
    }

    #[test]
    fn names_and_states_are_checked() {
        let blank: Create = read(json!({"name": "  "})).unwrap();
        assert!(blank.checked_name().is_err());
        let long: Create = read(json!({"name": "x".repeat(MAX_NAME_CHARS + 1)})).unwrap();
        assert!(long.checked_name().is_err());
        let nul: Create = read(json!({"name": "a\u{0}b"})).unwrap();
        assert!(nul.checked_name().is_err());
        let list: List = read(json!({"state": "sleeping"})).unwrap();
        assert!(list.checked_state().is_err());
        let list: List = read(json!({"state": "finalized"})).unwrap();
        assert_eq!(list.checked_state().unwrap(), Some(State::Finalized));
    }

    #[test]
    fn a_page_is_bounded_and_its_cursor_reads_back() {
        let list: List = read(json!({})).unwrap();
        assert_eq!(list.checked_limit().unwrap(), DEFAULT_PAGE_ROWS);
        for limit in [0, MAX_PAGE_ROWS + 1] {
            let list: List = read(json!({ "limit": limit })).unwrap();
            assert!(list.checked_limit().is_err(), "{limit}");
        }
        let place = ListCursor {
            created_at: UNIX_EPOCH + Duration::from_millis(1_700_000_000_123),
            id: SessionId(42),
        };
        let list: List = read(json!({ "cursor": cursor(place) })).unwrap();
        assert_eq!(list.checked_cursor().unwrap(), Some(place));
        for bad in ["", "12", "a.b", "1.-2", "99999999999999999999.1"] {
            let list: List = read(json!({ "cursor": bad })).unwrap();
            assert!(list.checked_cursor().is_err(), "{bad}");
        }
        let list: List = read(json!({ "since": "yesterday" })).unwrap();
        assert!(list.checked_since().is_err());
        let list: List = read(json!({ "since": "2025-01-31T12:00:00Z" })).unwrap();
        assert!(list.checked_since().unwrap().is_some());
    }

    fn since(text: &str) -> Result<Option<SystemTime>, RpcError> {
        read::<List>(json!({ "since": text }))
            .unwrap()
            .checked_since()
    }

    /// Every RFC 3339 time is taken, and read as the instant it names: an
    /// offset east of UTC is that much earlier, `t` and `z` may be lower
    /// case, a fraction of a second is kept.
    #[test]
    fn since_takes_every_rfc_3339_time_as_the_instant_it_names() {
        let at = |s: u64, ms: u64| Some(UNIX_EPOCH + Duration::from_millis(s * 1000 + ms));
        // 2020-01-01T00:00:00Z
        let new_year = 1_577_836_800;
        for (text, expected) in [
            ("2020-01-01T00:00:00Z", at(new_year, 0)),
            ("2020-01-01t00:00:00z", at(new_year, 0)),
            ("2020-01-01T00:00:00+00:00", at(new_year, 0)),
            ("2020-01-01T00:00:00-00:00", at(new_year, 0)),
            ("2020-01-01T00:00:00+01:00", at(new_year - 3600, 0)),
            ("2020-01-01T00:00:00-05:00", at(new_year + 5 * 3600, 0)),
            ("2020-01-01T05:30:00.250+05:30", at(new_year, 250)),
            ("2019-12-31T23:59:59.5-00:01", at(new_year + 59, 500)),
            ("2020-01-01 00:00:00Z", at(new_year, 0)),
            // Without an offset, as before: UTC.
            ("2020-01-01T00:00:00", at(new_year, 0)),
            ("1970-01-01T00:00:00Z", at(0, 0)),
            (
                "1970-01-01T00:30:00+01:00",
                Some(UNIX_EPOCH - Duration::from_secs(1800)),
            ),
            ("1969-12-31T23:00:00-01:00", at(0, 0)),
            (
                "1969-12-31T23:59:59Z",
                Some(UNIX_EPOCH - Duration::from_secs(1)),
            ),
            (
                "1600-02-29T00:00:00Z",
                Some(UNIX_EPOCH - Duration::from_secs(11_670_998_400)),
            ),
            (
                "0000-01-01T00:00:00Z",
                Some(UNIX_EPOCH - Duration::from_secs(62_167_219_200)),
            ),
        ] {
            match since(text) {
                Ok(time) => assert_eq!(time, expected, "{text}"),
                Err(e) => panic!("{text}: {}", e.message),
            }
        }
        for text in [
            "yesterday",
            "2020-01-01T00:00:00+1:00",
            "2020-01-01T00:00:00+24:00",
            "2020-01-01T00:00:00+01:60",
            "2020-01-01T00:00:00+0100",
            "2020-01-01T00:00:00Z+01:00",
            "2020-01-01T00:00:00+01:00Z",
            "2020-01-01T00:00:00.+01:00",
            "2020-01-01X00:00:00Z",
            "2020-13-01T00:00:00Z",
            "2019-02-29T00:00:00Z",
            "+020-01-01T00:00:00Z",
            "2020-01-01T00:00:00é",
            "é020-01-01T00:00:00Z",
            "",
        ] {
            assert!(since(text).is_err(), "{text}");
        }
    }
}
