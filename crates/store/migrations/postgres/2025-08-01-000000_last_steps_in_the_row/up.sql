-- A session's last timeline segment is kept in its own row. The finalize is
-- a session's last write: the segment its batch writes for it (the latch's
-- step, and the transitions that batch carries before it, such as a cancel
-- and its settling) goes into `sessions.last_steps` with the row's own
-- update, instead of a `timeline` row with its index entry and its foreign
-- key check. A teardown then writes its session rows and its turns, not a
-- third row per session. The timeline of a session reads as before: its
-- `timeline` segments in order, then `last_steps`. Rows written before keep
-- NULL and every segment in `timeline`.

ALTER TABLE sessions ADD COLUMN last_steps TEXT;

UPDATE settle_meta SET "value" = 8 WHERE "key" = 'schema_version';
