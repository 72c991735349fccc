UPDATE settle_meta SET "value" = 2 WHERE "key" = 'schema_version';
CREATE INDEX sessions_state ON sessions (state);

CREATE TABLE timeline_rows (
    id BIGSERIAL PRIMARY KEY,
    session BIGINT NOT NULL REFERENCES sessions (id),
    at BIGINT NOT NULL,
    from_state TEXT,
    to_state TEXT NOT NULL,
    cause TEXT NOT NULL
);
INSERT INTO timeline_rows (session, at, from_state, to_state, cause)
    SELECT t.session, (s.step ->> 0)::bigint, s.step ->> 1, s.step ->> 2, s.step ->> 3
    FROM timeline AS t, json_array_elements(t.steps::json) WITH ORDINALITY AS s (step, n)
    ORDER BY t.id, s.n;
DROP TABLE timeline;
ALTER TABLE timeline_rows RENAME TO timeline;
ALTER SEQUENCE timeline_rows_id_seq RENAME TO timeline_id_seq;
CREATE INDEX timeline_session ON timeline (session, id);
