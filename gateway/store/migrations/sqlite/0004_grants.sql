-- "always allow" grants (gateway/holds): an approver's standing
-- approval of one exact request (tool and canonical request hash) for
-- one agent and user, until expires or until revoked. doc is the
-- immutable rest as JSON (the granter's groups, the note).
CREATE TABLE grants (
	id         TEXT    PRIMARY KEY,
	agent      TEXT    NOT NULL,
	user       TEXT    NOT NULL,
	tool       TEXT    NOT NULL,
	sha256     TEXT    NOT NULL,
	hold       TEXT    NOT NULL,
	granted_by TEXT    NOT NULL,
	created    INTEGER NOT NULL,
	expires    INTEGER NOT NULL,
	doc        BLOB    NOT NULL,
	revoked    INTEGER NOT NULL DEFAULT 0,
	revoked_by TEXT    NOT NULL DEFAULT ''
) WITHOUT ROWID;
CREATE INDEX grants_match ON grants (agent, user, tool, sha256, expires);
CREATE INDEX grants_created ON grants (created DESC);
