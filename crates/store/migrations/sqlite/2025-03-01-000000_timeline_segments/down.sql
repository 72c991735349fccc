UPDATE settle_meta SET "value" = 2 WHERE "key" = 'schema_version';
CREATE INDEX sessions_state ON sessions (state);

CREATE TABLE timeline_rows (
    id INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    session BIGINT NOT NULL REFERENCES sessions (id),
    at BIGINT NOT NULL,
    from_state TEXT,
    to_state TEXT NOT NULL,
    cause TEXT NOT NULL
);
INSERT INTO timeline_rows (session, at, from_state, to_state, cause)
    SELECT t.session, json_extract(s.value, '$[0]'), json_extract(s.value, '$[1]'),
           json_extract(s.value, '$[2]'), json_extract(s.value, '$[3]')
    FROM timeline AS t, json_each(t.steps) AS s
    ORDER BY t.id, s.key;
DROP TABLE timeline;
ALTER TABLE timeline_rows RENAME TO timeline;
CREATE INDEX timeline_session ON timeline (session, id);
