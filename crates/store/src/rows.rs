//! Multi-row statements: `INSERT … VALUES (…), (…)` and `UPDATE … FROM
//! (VALUES (…), (…)) AS v WHERE …`, one parenthesised group of parameters per
//! row, bound straight from the rows.
//!
//! A batch writes thousands of rows; one statement per row costs Diesel's and
//! the database's per-statement work each time (measured at about three times
//! the cost of these statements for the session rows of a 10,000-session
//! teardown), and Diesel's boxed raw queries allocate for every parameter.
//! This fragment borrows the rows and binds each value in place; Diesel writes
//! the placeholders in each backend's style, and keeps full statements
//! prepared. In `UPDATE … FROM (VALUES …) AS
//! v`, the values' columns are `v.column1`, `v.column2`, … on both backends.

use diesel::backend::Backend;
use diesel::query_builder::{AstPass, QueryFragment, QueryId};
use diesel::result::QueryResult;
use diesel::RunQueryDsl;

/// How many rows one statement carries at most, well under both backends'
/// bind limits.
pub(crate) const ROWS_PER_STATEMENT: usize = 256;

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

/// A row of parameters.
pub(crate) trait Params<DB: Backend> {
    /// Push this row's parameters, comma-separated, in column order.
    fn push<'b>(&'b self, out: &mut AstPass<'_, 'b, DB>) -> QueryResult<()>;
}

/// `head (…), (…), … tail`, one group per row.
pub(crate) struct Rows<'a, P> {
    head: &'static str,
    rows: &'a [P],
    tail: &'static str,
}

impl<'a, P> Rows<'a, P> {
    /// `INSERT INTO target VALUES (…), …`; `target` names the table and its
    /// columns, e.g. `"timeline (session, steps)"`.
    pub(crate) fn insert(head: &'static str, rows: &'a [P]) -> Self {
        Rows {
            head,
            rows,
            tail: "",
        }
    }

    /// `UPDATE … SET … FROM (VALUES (…), …) AS v WHERE …`: `head` is the
    /// statement up to and including `(VALUES `, `tail` from `) AS v`.
    pub(crate) fn update(head: &'static str, rows: &'a [P], tail: &'static str) -> Self {
        Rows { head, rows, tail }
    }
}

impl<DB: Backend, P: Params<DB>> QueryFragment<DB> for Rows<'_, P> {
    fn walk_ast<'b>(&'b self, mut out: AstPass<'_, 'b, DB>) -> QueryResult<()> {
        // The text depends on the number of rows: only the lengths `pieces`
        // cuts recur.
        if !self.rows.len().is_power_of_two() || self.rows.len() > ROWS_PER_STATEMENT {
            out.unsafe_to_cache_prepared();
        }
        out.push_sql(self.head);
        for (k, row) in self.rows.iter().enumerate() {
            out.push_sql(if k == 0 { "(" } else { ", (" });
            row.push(&mut out)?;
            out.push_sql(")");
        }
        out.push_sql(self.tail);
        Ok(())
    }
}

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

/// `Params` for both backends, from one body:
/// `params!(Row<'a>, |row, out| bind!(out; BigInt => &row.id))`.
macro_rules! params {
    ($row:ident $(<$l:lifetime>)?, |$this:ident, $out:ident| $body:expr) => {
        impl $(<$l>)? $crate::rows::Params<diesel::sqlite::Sqlite> for $row $(<$l>)? {
            fn push<'x>(
                &'x self,
                $out: &mut diesel::query_builder::AstPass<'_, 'x, diesel::sqlite::Sqlite>,
            ) -> diesel::result::QueryResult<()> {
                let $this = self;
                $body
            }
        }
        impl $(<$l>)? $crate::rows::Params<diesel::pg::Pg> for $row $(<$l>)? {
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
pub(crate) use params;

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
