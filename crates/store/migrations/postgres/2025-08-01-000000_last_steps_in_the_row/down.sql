UPDATE settle_meta SET "value" = 7 WHERE "key" = 'schema_version';
-- Every turn that ended with its session gets its end in its own row.
UPDATE turns SET
    ended_at = (SELECT finalized_at FROM sessions WHERE sessions.id = turns.session),
    outcome = (SELECT outcome FROM sessions WHERE sessions.id = turns.session)
WHERE ended_at IS NULL
  AND session IN (SELECT id FROM sessions WHERE state = 'finalized');
-- Every last segment back at the end of its session's timeline.
INSERT INTO timeline (session, steps)
    SELECT id, last_steps FROM sessions WHERE last_steps IS NOT NULL ORDER BY id;
ALTER TABLE sessions DROP COLUMN last_steps;
