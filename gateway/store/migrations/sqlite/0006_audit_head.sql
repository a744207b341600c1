-- the audit log's head as the gateway last made it durable
-- (THREATS G9): at start a log that does not reach it, or holds
-- another record at its seq, is refused. One row.
CREATE TABLE audit_head (
	id      INTEGER PRIMARY KEY CHECK (id = 1),
	seq     INTEGER NOT NULL,
	hash    TEXT    NOT NULL,
	updated INTEGER NOT NULL
);
