UPDATE settle_meta SET "value" = 6 WHERE "key" = 'schema_version';
-- Version 6 claims chunk numbers from next_seq, which version 7 stopped
-- writing on SQLite: set it to one past each turn's last chunk again.
UPDATE turns SET next_seq = COALESCE(
    (SELECT MAX(chunks.seq) + 1 FROM chunks
     WHERE chunks.session = turns.session AND chunks.turn_no = turns."no"),
    0
);
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(
    sql,
    'CHECK (state = ''registered'' OR state = ''running'' OR state = ''cancelling'' OR state = ''settled'' OR state = ''finalized'')',
    'CHECK (state IN (''registered'', ''running'', ''cancelling'', ''settled'', ''finalized''))'
)
WHERE type = 'table' AND name = 'sessions';
PRAGMA writable_schema = RESET;
CREATE TABLE settle_schema_reload (x);
DROP TABLE settle_schema_reload;
