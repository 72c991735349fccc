UPDATE settle_meta SET "value" = 1 WHERE "key" = 'schema_version';
DROP INDEX sessions_created;
ALTER TABLE sessions DROP COLUMN resumed_from;
ALTER TABLE chunks DROP COLUMN data;
ALTER TABLE chunks DROP COLUMN kind;
ALTER TABLE turns DROP COLUMN error_message;
ALTER TABLE turns DROP COLUMN error_kind;
ALTER TABLE turns DROP COLUMN input;
