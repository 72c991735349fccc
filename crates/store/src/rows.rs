//! Multi-row statements: `INSERT … VALUES (…), (…)`, one parenthesised
//! group of parameters per row, bound straight from the rows; and `UPDATE …
//! WHERE … IN (…)` for a set of rows written to the same values.
//!
//! A batch writes thousands of rows; one statement per row costs Diesel's and
//! the database's per-statement work each time (measured at about three times
//! the cost of these statements for the session rows of a 10,000-session
//! teardown), and Diesel's boxed raw queries allocate for every parameter.
//! These fragments borrow the rows and bind each value in place; Diesel
//! writes the placeholders in each backend's style, and keeps full statements
//! prepared.

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::RunQueryDsl;

/// How many rows one statement carries at most, well under both backends'
/// bind limits.
pub(crate) const ROWS_PER_STATEMENT: usize = 256;

// `insert_rows!` names every power of two up to it.
const _: () = assert!(ROWS_PER_STATEMENT == 256);

/// `rows` cut into statements that stay prepared: full ones of
/// [`ROWS_PER_STATEMENT`] rows, then the rest as pieces of a power of two
/// rows each, largest first (100 rows: 64, 32, 4). Diesel keeps a statement
/// prepared per connection by its text, so each table has at most nine
/// texts, each parsed once; a statement of any other length would be parsed
/// again every time (at one chunk per transaction that parse was most of
/// the writer's time).
pub(crate) fn pieces<P>(rows: &[P]) -> impl Iterator<Item = &[P]> {
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = rest.len().min(ROWS_PER_STATEMENT);
        // The largest power of two not above `n`.
        let take = 1 << (usize::BITS - 1 - n.leading_zeros());
        let (piece, tail) = rest.split_at(take);
        rest = tail;
        Some(piece)
    })
}

/// `rows` grouped by what they are set to, each group's keys in order, the
/// groups in the order of their first key.
pub(crate) fn grouped<K: Copy + Eq + std::hash::Hash>(
    rows: impl Iterator<Item = (K, i64)>,
) -> Vec<(K, Vec<i64>)> {
    let mut at: std::collections::HashMap<K, usize, foldhash::fast::RandomState> =
        std::collections::HashMap::default();
    let mut groups: Vec<(K, Vec<i64>)> = Vec::new();
    for (key, id) in rows {
        let slot = *at.entry(key).or_insert_with(|| {
            groups.push((key, Vec::new()));
            groups.len() - 1
        });
        groups[slot].1.push(id);
    }
    for (_, ids) in &mut groups {
        ids.sort_unstable();
    }
    groups.sort_unstable_by_key(|(_, ids)| ids.first().copied());
    groups
}

/// A row of parameters.
pub(crate) trait Params<DB: Backend> {
    /// Push this row's parameters, comma-separated, in column order.
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>;
}

/// A kind of row and the one statement it is inserted with.
pub(crate) trait Insert {
    /// `INSERT INTO table (columns) VALUES `.
    const HEAD: &'static str;
    /// Names the kind in Diesel's statement cache: the row's type without
    /// its lifetimes.
    type Id: 'static;
}

/// `HEAD (…), (…), …`, one group per row, of a length [`pieces`] does not
/// cut: what [`insert_rows!`] falls back to. Every length that recurs goes
/// through [`Exactly`], so this one is parsed afresh each time. (Keyed by
/// its text, Diesel would build that text on every execution to find the
/// statement it keeps prepared: at one row per transaction, about a sixth
/// of the writer.)
pub(crate) struct Rows<'a, P> {
    rows: &'a [P],
}

impl<'a, P> Rows<'a, P> {
    /// `INSERT … VALUES (…), …` of `rows`.
    pub(crate) fn of(rows: &'a [P]) -> Self {
        Rows { rows }
    }
}

/// Push `HEAD (…), (…), …` for `rows`.
fn push_rows<'b, DB: Backend, P: Params<DB> + Insert>(
    rows: &'b [P],
    out: &mut AstPass<'_, 'b, DB>,
) -> QueryResult<()> {
    out.push_sql(P::HEAD);
    for (k, row) in rows.iter().enumerate() {
        out.push_sql(if k == 0 { "(" } else { ", (" });
        row.push(out)?;
        out.push_sql(")");
    }
    Ok(())
}

impl<DB: Backend, P: Params<DB> + Insert> QueryFragment<DB> for Rows<'_, P> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        out.unsafe_to_cache_prepared();
        push_rows(self.rows, &mut out)
    }
}

/// [`Rows`] of exactly `N` rows: its type names its text, so Diesel finds
/// the prepared statement by the type and never builds the text again.
pub(crate) struct Exactly<'a, P, const N: usize> {
    rows: &'a [P],
}

impl<'a, P, const N: usize> Exactly<'a, P, N> {
    /// `rows`, which must be `N` of them (checked by [`insert_rows!`]).
    pub(crate) fn of(rows: &'a [P]) -> Self {
        debug_assert_eq!(rows.len(), N);
        Exactly { rows }
    }
}

impl<DB: Backend, P: Params<DB> + Insert, const N: usize> QueryFragment<DB> for Exactly<'_, P, N> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        push_rows(self.rows, &mut out)
    }
}

impl<P: Insert, const N: usize> QueryId for Exactly<'_, P, N> {
    type QueryId = (P::Id, [(); N]);
    const HAS_STATIC_QUERY_ID: bool = true;
}

impl<P, Conn, const N: usize> RunQueryDsl<Conn> for Exactly<'_, P, N> {}

/// Execute the insert of `rows` (a piece [`pieces`] cut) on `c`: as an
/// [`Exactly`] of its length when that is one `pieces` cuts, else as
/// [`Rows`].
macro_rules! insert_rows {
    ($c:expr, $rows:expr) => {{
        use diesel::RunQueryDsl as _;
        use $crate::rows::{Exactly, Rows};
        let rows = $rows;
        match rows.len() {
            1 => Exactly::<_, 1>::of(rows).execute($c),
            2 => Exactly::<_, 2>::of(rows).execute($c),
            4 => Exactly::<_, 4>::of(rows).execute($c),
            8 => Exactly::<_, 8>::of(rows).execute($c),
            16 => Exactly::<_, 16>::of(rows).execute($c),
            32 => Exactly::<_, 32>::of(rows).execute($c),
            64 => Exactly::<_, 64>::of(rows).execute($c),
            128 => Exactly::<_, 128>::of(rows).execute($c),
            256 => Exactly::<_, 256>::of(rows).execute($c),
            _ => Rows::of(rows).execute($c),
        }
    }};
}
pub(crate) use insert_rows;

/// `UPDATE … SET … WHERE … IN (?, ?, …)`: one statement for every row that
/// is set to the same values, the values bound once and then one key per
/// row. On SQLite a set of rows named by key is updated about twice as fast
/// as the same rows joined from `(VALUES …)`, which the database first
/// copies into a table of its own.
pub(crate) struct InList<'a, G> {
    /// What every row is set to, and the condition they share.
    pub(crate) group: &'a G,
    /// The keys of the rows.
    pub(crate) keys: &'a [i64],
    /// What follows the list: nothing, or a `RETURNING` of one `BIGINT`
    /// column (see [`Query`](diesel::query_builder::Query) below).
    pub(crate) tail: &'static str,
}

/// The head of an [`InList`] update: the statement up to and including
/// `IN (`, with its parameters.
pub(crate) trait GroupHead<DB: Backend> {
    /// Push the statement's text and parameters up to `IN (`.
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>;
}

impl<DB: Backend, G: GroupHead<DB>> QueryFragment<DB> for InList<'_, G>
where
    i64: diesel::serialize::ToSql<diesel::sql_types::BigInt, DB>,
{
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        if !self.keys.len().is_power_of_two() || self.keys.len() > ROWS_PER_STATEMENT {
            out.unsafe_to_cache_prepared();
        }
        self.group.push(&mut out)?;
        for (k, key) in self.keys.iter().enumerate() {
            if k > 0 {
                out.push_sql(", ");
            }
            out.push_bind_param::<diesel::sql_types::BigInt, _>(key)?;
        }
        out.push_sql(")");
        out.push_sql(self.tail);
        Ok(())
    }
}

impl<G> QueryId for InList<'_, G> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

/// An [`InList`] with a `RETURNING` tail loads the one `BIGINT` it returns.
impl<G> diesel::query_builder::Query for InList<'_, G> {
    type SqlType = diesel::sql_types::BigInt;
}

impl<G, Conn> RunQueryDsl<Conn> for InList<'_, G> {}

impl<P> QueryId for Rows<'_, P> {
    type QueryId = ();
    const HAS_STATIC_QUERY_ID: bool = false;
}

impl<P, Conn> RunQueryDsl<Conn> for Rows<'_, P> {}

/// Push `values`, comma-separated, each with its SQL type:
/// `bind!(out; BigInt => &self.id, Text => self.name)`.
macro_rules! bind {
    ($out:expr; $first_ty:ty => $first:expr $(, $ty:ty => $value:expr)* $(,)?) => {{
        $out.push_bind_param::<$first_ty, _>($first)?;
        $(
            $out.push_sql(", ");
            $out.push_bind_param::<$ty, _>($value)?;
        )*
        Ok(())
    }};
}
pub(crate) use bind;

/// An implementation of one of this module's traits (`Params`,
/// `GroupHead`) for both backends, from one body of `push`.
macro_rules! both_backends {
    ($trait:ident, $row:ident $(<$l:lifetime>)?, |$this:ident, $out:ident| $body:expr) => {
        impl $(<$l>)? $crate::rows::$trait<diesel::sqlite::Sqlite> for $row $(<$l>)? {
            fn push<'x>(
                &'x self,
                $out: &mut diesel::query_builder::AstPass<'_, 'x, diesel::sqlite::Sqlite>,
            ) -> diesel::result::QueryResult<()> {
                let $this = self;
                $body
            }
        }
        impl $(<$l>)? $crate::rows::$trait<diesel::pg::Pg> for $row $(<$l>)? {
            fn push<'x>(
                &'x self,
                $out: &mut diesel::query_builder::AstPass<'_, 'x, diesel::pg::Pg>,
            ) -> diesel::result::QueryResult<()> {
                let $this = self;
                $body
            }
        }
    };
}
pub(crate) use both_backends;

/// `Params` for both backends, from one body:
/// `params!(Row<'a>, |row, out| bind!(out; BigInt => &row.id))`.
macro_rules! params {
    ($row:ident $(<$l:lifetime>)?, |$this:ident, $out:ident| $body:expr) => {
        $crate::rows::both_backends!(Params, $row $(<$l>)?, |$this, $out| $body);
    };
}
pub(crate) use params;

/// `GroupHead` for both backends, from one body:
/// `group_head!(Set, |set, out| { out.push_sql("UPDATE … IN ("); Ok(()) })`.
macro_rules! group_head {
    ($row:ident $(<$l:lifetime>)?, |$this:ident, $out:ident| $body:block) => {
        $crate::rows::both_backends!(GroupHead, $row $(<$l>)?, |$this, $out| $body);
    };
}
pub(crate) use group_head;

#[cfg(test)]
mod tests {
    use super::{pieces, ROWS_PER_STATEMENT};

    fn lengths(n: usize) -> Vec<usize> {
        let rows: Vec<usize> = (0..n).collect();
        let cut: Vec<&[usize]> = pieces(&rows).collect();
        // Every row once, in order.
        assert_eq!(cut.concat(), rows);
        cut.iter().map(|p| p.len()).collect()
    }

    #[test]
    fn pieces_are_full_statements_then_powers_of_two() {
        assert!(lengths(0).is_empty());
        assert_eq!(lengths(1), [1]);
        assert_eq!(lengths(16), [16]);
        assert_eq!(lengths(100), [64, 32, 4]);
        assert_eq!(lengths(ROWS_PER_STATEMENT), [ROWS_PER_STATEMENT]);
        assert_eq!(
            lengths(2 * ROWS_PER_STATEMENT + 3),
            [ROWS_PER_STATEMENT, ROWS_PER_STATEMENT, 2, 1]
        );
        for n in 0..1000 {
            assert!(lengths(n)
                .iter()
                .all(|&l| l.is_power_of_two() && l <= ROWS_PER_STATEMENT));
        }
    }
}
