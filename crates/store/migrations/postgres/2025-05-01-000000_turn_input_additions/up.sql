-- A turn stores the messages it adds to its session's conversation, not the
-- whole conversation again (which grew with the square of its length).
-- `input_from` NULL: `input` is everything the turn was sent, as every row
-- written before holds. `input_from` k: the turn was sent the first k
-- messages of the conversation as the previous turn left it (what that turn
-- was sent, then its reply as an assistant message), then `input`.

ALTER TABLE turns ADD COLUMN input_from BIGINT;

UPDATE settle_meta SET "value" = 5 WHERE "key" = 'schema_version';
