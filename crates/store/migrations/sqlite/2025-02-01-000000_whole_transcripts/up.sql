-- Whole transcripts: what each turn was sent and why it failed, structured
-- chunks beside text ones, and the session a resumed session continues.
-- Every new column is nullable or has a default, so rows written before keep
-- their meaning: a turn with no input recorded, text chunks, no resume.

ALTER TABLE turns ADD COLUMN input TEXT;
ALTER TABLE turns ADD COLUMN error_kind TEXT;
ALTER TABLE turns ADD COLUMN error_message TEXT;

ALTER TABLE chunks ADD COLUMN kind TEXT NOT NULL DEFAULT 'text';
ALTER TABLE chunks ADD COLUMN data TEXT;

ALTER TABLE sessions ADD COLUMN resumed_from BIGINT REFERENCES sessions (id);

-- `settle sessions` lists newest first, optionally since a time.
CREATE INDEX sessions_created ON sessions (created_at);

UPDATE settle_meta SET "value" = 2 WHERE "key" = 'schema_version';
