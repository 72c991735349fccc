//! Session ids handed out in blocks: a runtime reserves a block up front and
//! registers sessions under ids it already holds, so that registering never
//! waits for the store on the task that owns the lifecycle core. The counter
//! lives in `settle_meta` (`next_session_id`), so ids are never handed out
//! twice, across processes; an id reserved and never used leaves a gap.

use std::ops::Range;

use diesel::sql_types::BigInt;
use diesel::Connection;

use crate::conn::Db;
use crate::error::StoreError;

/// The row `UPDATE … RETURNING` gives back.
#[derive(diesel::QueryableByName)]
pub(crate) struct Next {
    #[diesel(sql_type = BigInt)]
    pub(crate) value: i64,
}

/// The statement that creates the counter above every id already in use; a
/// no-op once it exists. (`WHERE TRUE` lets SQLite parse `ON CONFLICT` after
/// a `SELECT`.)
pub(crate) const SEED: &str = "INSERT INTO settle_meta (\"key\", \"value\") \
     SELECT 'next_session_id', COALESCE(MAX(id), 0) + 1 FROM sessions WHERE TRUE \
     ON CONFLICT (\"key\") DO NOTHING";

/// The statement that takes ids from the counter; bind the count.
pub(crate) const TAKE: &str = "UPDATE settle_meta SET \"value\" = \"value\" + $1 \
     WHERE \"key\" = 'next_session_id' RETURNING \"value\"";

/// Reserve `$count` ids on connection `$c`, inside the caller's transaction.
macro_rules! reserve_ids_on {
    ($c:expr, $count:expr) => {{
        use diesel::RunQueryDsl;
        use $crate::error::Context;
        diesel::sql_query($crate::ids::SEED)
            .execute($c)
            .context("seeding the session id counter")?;
        let next: $crate::ids::Next = diesel::sql_query($crate::ids::TAKE)
            .bind::<diesel::sql_types::BigInt, i64>(i64::from($count))
            .get_result($c)
            .context("reserving session ids")?;
        $crate::ids::range(next.value, $count)
    }};
}

/// The ids `[end - count, end)`, checked.
pub(crate) fn range(end: i64, count: u32) -> Result<Range<u64>, StoreError> {
    let end = u64::try_from(end).map_err(|_| StoreError::Corrupt {
        session: None,
        column: "settle_meta.value",
        value: end.to_string(),
    })?;
    Ok(end.saturating_sub(u64::from(count))..end)
}

/// Reserve `count` fresh session ids in a transaction of their own.
pub(crate) fn reserve(db: Db<'_>, count: u32) -> Result<Range<u64>, StoreError> {
    write_tx!(db, |c| reserve_ids_on!(c, count))
}
