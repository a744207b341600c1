-- the audit log heads, one per log: gateway replicas sharing a database
-- each write their own hash-chained file (THREATS G9 per replica). The
-- single head of audit_head (6) carries over as the log '' that an SQLite
-- store's one gateway keeps using.
CREATE TABLE audit_heads (
	log     TEXT    PRIMARY KEY,
	seq     INTEGER NOT NULL,
	hash    TEXT    NOT NULL,
	updated INTEGER NOT NULL
);
INSERT INTO audit_heads (log, seq, hash, updated) SELECT '', seq, hash, updated FROM audit_head;
