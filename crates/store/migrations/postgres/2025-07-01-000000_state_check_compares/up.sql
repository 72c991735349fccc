-- Schema version 7 changed the form of SQLite's check on `sessions.state`
-- (see the SQLite migration of the same name). PostgreSQL tests an `IN` list
-- as one array comparison, so its check stays as it is; the version moves
-- with SQLite's so that one number names one schema on both.
UPDATE settle_meta SET "value" = 7 WHERE "key" = 'schema_version';
