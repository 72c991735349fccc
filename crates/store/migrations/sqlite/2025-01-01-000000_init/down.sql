DROP TABLE memories;
DROP TABLE timeline;
DROP TABLE chunks;
DROP TABLE turns;
DROP TABLE sessions;
DROP TABLE owners;
DROP TABLE settle_meta;
