UPDATE settle_meta SET "value" = 6 WHERE "key" = 'schema_version';
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
