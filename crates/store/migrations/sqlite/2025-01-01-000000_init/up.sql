-- The settle session store, SQLite flavour. Timestamps are milliseconds since
-- the UNIX epoch; states, outcomes and end reasons are settle-core's spellings.

CREATE TABLE settle_meta (
    "key" TEXT PRIMARY KEY NOT NULL,
    "value" BIGINT NOT NULL
);
INSERT INTO settle_meta ("key", "value") VALUES ('schema_version', 1);

CREATE TABLE owners (
    id INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    host TEXT NOT NULL,
    pid BIGINT NOT NULL,
    started_at BIGINT NOT NULL,
    lease_expires_at BIGINT NOT NULL
);

CREATE TABLE sessions (
    id INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    name TEXT NOT NULL,
    parent BIGINT REFERENCES sessions (id),
    tree BIGINT NOT NULL,
    state TEXT NOT NULL
        CHECK (state IN ('registered', 'running', 'cancelling', 'settled', 'finalized')),
    outcome TEXT,
    end_reason TEXT,
    closing_reason TEXT,
    open_turn BIGINT,
    created_at BIGINT NOT NULL,
    finalized_at BIGINT,
    finalize_errors TEXT,
    version BIGINT NOT NULL DEFAULT 0,
    owner BIGINT NOT NULL REFERENCES owners (id)
);
CREATE INDEX sessions_state ON sessions (state);
CREATE INDEX sessions_owner ON sessions (owner);
CREATE INDEX sessions_parent ON sessions (parent);

CREATE TABLE turns (
    session BIGINT NOT NULL REFERENCES sessions (id),
    "no" BIGINT NOT NULL,
    outcome TEXT,
    started_at BIGINT NOT NULL,
    ended_at BIGINT,
    next_seq BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (session, "no")
);

CREATE TABLE chunks (
    session BIGINT NOT NULL,
    turn_no BIGINT NOT NULL,
    seq BIGINT NOT NULL,
    "text" TEXT NOT NULL,
    PRIMARY KEY (session, turn_no, seq),
    FOREIGN KEY (session, turn_no) REFERENCES turns (session, "no")
);

CREATE TABLE timeline (
    id INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    session BIGINT NOT NULL REFERENCES sessions (id),
    at BIGINT NOT NULL,
    from_state TEXT,
    to_state TEXT NOT NULL,
    cause TEXT NOT NULL
);
CREATE INDEX timeline_session ON timeline (session, id);

CREATE TABLE memories (
    id INTEGER PRIMARY KEY AUTOINCREMENT NOT NULL,
    session BIGINT NOT NULL REFERENCES sessions (id),
    turn_no BIGINT NOT NULL,
    content TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
CREATE INDEX memories_session ON memories (session);
