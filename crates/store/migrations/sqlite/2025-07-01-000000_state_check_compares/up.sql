-- The check on `sessions.state` compares the word with each of the five
-- lifecycle states instead of testing it against an `IN` list. SQLite codes an
-- `IN` list of more than two values as a temporary table, built again for
-- every row whose state a statement writes: about half of what moving a
-- session's row to its next state cost, paid by every registration, turn and
-- finalize. The two forms accept exactly the same words.
--
-- SQLite cannot alter a constraint, and rebuilding the table would copy every
-- session under the foreign keys that point at it. This is the procedure
-- SQLite documents for changing a CHECK constraint in place (the
-- "writable_schema" steps of its ALTER TABLE page): the table's text in the
-- schema is rewritten, the file's pages are untouched, and every row already
-- satisfies the new check because it satisfied the old one. A file whose
-- text differs (not created by these migrations) keeps its check as it is.
--
-- From this version on, SQLite numbers a turn's chunks from its last chunk
-- (one past the highest `seq`), and `turns.next_seq` is no longer written:
-- a settle that claims numbers from it refuses this version as newer.
PRAGMA writable_schema = ON;
UPDATE sqlite_master
SET sql = replace(
    sql,
    'CHECK (state IN (''registered'', ''running'', ''cancelling'', ''settled'', ''finalized''))',
    'CHECK (state = ''registered'' OR state = ''running'' OR state = ''cancelling'' OR state = ''settled'' OR state = ''finalized'')'
)
WHERE type = 'table' AND name = 'sessions';
-- This connection reads the schema again; a schema change (the table made
-- and dropped) tells every other connection to, and rolls both back with the
-- migration if it fails.
PRAGMA writable_schema = RESET;
CREATE TABLE settle_schema_reload (x);
DROP TABLE settle_schema_reload;

UPDATE settle_meta SET "value" = 7 WHERE "key" = 'schema_version';
