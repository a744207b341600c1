-- token buckets shared by the gateways of one database (agents[].rate_limit
-- per sandbox, across replicas). Used on PostgreSQL; an SQLite store's one
-- gateway keeps its buckets in memory, and the table stays empty.
CREATE TABLE rate_buckets (
	key     TEXT    PRIMARY KEY,
	tokens  REAL    NOT NULL,
	updated INTEGER NOT NULL
);
