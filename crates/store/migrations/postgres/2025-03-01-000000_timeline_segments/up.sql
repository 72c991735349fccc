-- A timeline row is now a segment: the transitions of one session written
-- together (by one write, or by one batch of writes), in order, as a JSON
-- array of [at, from, to, cause] steps. A teardown writes one row per
-- session instead of one per transition; `settle show` reads the segments in
-- order and gets every transition back. Each old row becomes a one-step
-- segment.

ALTER TABLE timeline ADD COLUMN steps TEXT NOT NULL DEFAULT '[]';
UPDATE timeline SET steps = json_build_array(json_build_array(at, from_state, to_state, cause))::text;
ALTER TABLE timeline
    DROP COLUMN at,
    DROP COLUMN from_state,
    DROP COLUMN to_state,
    DROP COLUMN cause;

-- Every state change paid for this index; the state is rarely selective, and
-- recovery's `state <> 'finalized'` cannot use it.
DROP INDEX sessions_state;

UPDATE settle_meta SET "value" = 3 WHERE "key" = 'schema_version';
