UPDATE settle_meta SET "value" = 5 WHERE "key" = 'schema_version';
DROP TABLE session_principals;
DROP INDEX sessions_released;
ALTER TABLE sessions DROP COLUMN released_at;
ALTER TABLE owners DROP COLUMN advertise;
