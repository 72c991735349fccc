UPDATE settle_meta SET "value" = 4 WHERE "key" = 'schema_version';
ALTER TABLE turns DROP COLUMN input_from;
