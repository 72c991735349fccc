UPDATE settle_meta SET "value" = 6 WHERE "key" = 'schema_version';
