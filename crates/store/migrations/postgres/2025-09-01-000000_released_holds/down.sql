DROP TABLE released_holds;
UPDATE settle_meta SET "value" = 8 WHERE "key" = 'schema_version';
