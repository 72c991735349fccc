-- Where an owner runs, for recovery's "its process is gone" shortcut: the
-- machine identity (machine id, else boot id) and the PID namespace (the
-- inode of /proc/self/ns/pid). A pid names the same process only when both
-- match; a host name alone never says so. Owners registered before have
-- neither, so only their lease speaks for them.

ALTER TABLE owners ADD COLUMN machine TEXT;
ALTER TABLE owners ADD COLUMN pid_namespace BIGINT;

UPDATE settle_meta SET "value" = 4 WHERE "key" = 'schema_version';
