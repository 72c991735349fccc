UPDATE settle_meta SET "value" = 7 WHERE "key" = 'schema_version';
-- Every last segment back at the end of its session's timeline.
INSERT INTO timeline (session, steps)
    SELECT id, last_steps FROM sessions WHERE last_steps IS NOT NULL ORDER BY id;
ALTER TABLE sessions DROP COLUMN last_steps;
