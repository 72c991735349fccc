-- A session's end is one row write. The finalize is a session's last
-- write, so the segment its batch writes for it (the latch's step, and the
-- transitions that batch carries before it, such as a cancel and its
-- settling) is its last. It is kept in `last_segments` and named from the
-- session's row (`sessions.last_segment`), set by the row's own update,
-- instead of a `timeline` row with its index entry and its foreign key
-- check. Sessions whose last segments are the same (a teardown's, ended at
-- one moment for one reason) name one row: a session's row grows by a
-- number, not by its segment's text, which made SQLite rebalance its pages
-- as the rows grew. The timeline of a session reads as before: its
-- `timeline` segments in order, then its last segment. Rows written
-- before name none and keep every segment in `timeline`.
--
-- `last_segment` has no foreign key: a last segment is never deleted, and
-- the check would cost every finalize a lookup.
--
-- From this version on, a turn whose end the finalize carries, when that
-- end says no more than the session's row does (it ended at the finalize,
-- with the session's outcome, and no error), keeps no end in its own row:
-- a finalized session's turn without `ended_at` ended at the session's
-- `finalized_at` with its `outcome`. (Before, a finalize closed every turn
-- still open, so no such turn exists in rows written before.)

CREATE TABLE last_segments (
    id INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    steps TEXT NOT NULL
);
ALTER TABLE sessions ADD COLUMN last_segment BIGINT;

UPDATE settle_meta SET "value" = 8 WHERE "key" = 'schema_version';
