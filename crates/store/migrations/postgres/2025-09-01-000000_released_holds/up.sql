-- A session released for adoption while something holds it open (input
-- asked of a person, a delegation outstanding: SPEC §5) keeps its holds
-- here until a process adopts it, which takes them on (G3: a held session
-- is reclaimable by no automatic path, in any process). A released
-- session with a row here is not reaped as idle. Most releases are of
-- sessions with no hold, which write no row.

CREATE TABLE released_holds (
    session BIGINT PRIMARY KEY NOT NULL REFERENCES sessions (id),
    pending_input BIGINT NOT NULL,
    delegation BIGINT NOT NULL
);

UPDATE settle_meta SET "value" = 9 WHERE "key" = 'schema_version';
