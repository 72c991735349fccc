-- A fleet of processes on one database (SPEC §12). Each owner stores where
-- clients reach it. A session released by its owner for another process to
-- adopt keeps its last owner in `owner`, for the record, and `released_at`
-- says since when it has none: NULL while a process owns it. A session's
-- principal is who may use it through a gateway, kept so that every process
-- of the fleet enforces it, not only the one it was created on.

ALTER TABLE owners ADD COLUMN advertise TEXT;
ALTER TABLE sessions ADD COLUMN released_at BIGINT;
CREATE INDEX sessions_released ON sessions (released_at);
CREATE TABLE session_principals (
    session BIGINT PRIMARY KEY NOT NULL REFERENCES sessions (id),
    principal TEXT NOT NULL
);

UPDATE settle_meta SET "value" = 6 WHERE "key" = 'schema_version';
