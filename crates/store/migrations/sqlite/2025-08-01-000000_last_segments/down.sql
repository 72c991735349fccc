UPDATE settle_meta SET "value" = 7 WHERE "key" = 'schema_version';
-- Every turn that ended with its session gets its end in its own row.
UPDATE turns SET
    ended_at = (SELECT finalized_at FROM sessions WHERE sessions.id = turns.session),
    outcome = (SELECT outcome FROM sessions WHERE sessions.id = turns.session)
WHERE ended_at IS NULL
  AND session IN (SELECT id FROM sessions WHERE state = 'finalized');
-- Every last segment back at the end of its session's timeline.
INSERT INTO timeline (session, steps)
    SELECT sessions.id, last_segments.steps
    FROM sessions JOIN last_segments ON last_segments.id = sessions.last_segment
    ORDER BY sessions.id;
ALTER TABLE sessions DROP COLUMN last_segment;
DROP TABLE last_segments;
