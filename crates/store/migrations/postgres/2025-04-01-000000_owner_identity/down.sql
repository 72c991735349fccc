UPDATE settle_meta SET "value" = 3 WHERE "key" = 'schema_version';
ALTER TABLE owners DROP COLUMN pid_namespace;
ALTER TABLE owners DROP COLUMN machine;
