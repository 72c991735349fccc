-- A session's end is one row write. The finalize is a session's last
-- write: the segment its batch writes for it (the latch's step, and the
-- transitions that batch carries before it, such as a cancel and its
-- settling) goes into `sessions.last_steps` with the row's own update,
-- instead of a `timeline` row with its index entry and its foreign key
-- check. The timeline of a session reads as before: its `timeline`
-- segments in order, then `last_steps`. Rows written before keep NULL and
-- every segment in `timeline`.
--
-- From this version on, a turn whose end the finalize carries, when that
-- end says no more than the session's row does (it ended at the finalize,
-- with the session's outcome, and no error), keeps no end in its own row:
-- a finalized session's turn without `ended_at` ended at the session's
-- `finalized_at` with its `outcome`. (Before, a finalize closed every turn
-- still open, so no such turn exists in rows written before.)

ALTER TABLE sessions ADD COLUMN last_steps TEXT;

UPDATE settle_meta SET "value" = 8 WHERE "key" = 'schema_version';
