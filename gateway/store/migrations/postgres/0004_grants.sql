-- "always allow" grants (gateway/holds): an approver's standing
-- approval of one exact request (tool and canonical request hash) for
-- one agent and user, until expires or until revoked. doc is the
-- immutable rest as JSON (the granter's groups, the note).
CREATE TABLE grants (
	id         TEXT   PRIMARY KEY,
	agent      TEXT   NOT NULL,
	"user"     TEXT   NOT NULL,
	tool       TEXT   NOT NULL,
	sha256     TEXT   NOT NULL,
	hold       TEXT   NOT NULL,
	granted_by TEXT   NOT NULL,
	created    BIGINT NOT NULL,
	expires    BIGINT NOT NULL,
	doc        BYTEA  NOT NULL,
	revoked    BIGINT NOT NULL DEFAULT 0,
	revoked_by TEXT   NOT NULL DEFAULT ''
);
CREATE INDEX grants_match ON grants (agent, "user", tool, sha256, expires);
CREATE INDEX grants_created ON grants (created DESC);
