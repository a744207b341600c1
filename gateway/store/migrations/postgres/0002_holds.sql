-- held calls (gateway/holds). doc is the immutable part as JSON; the
-- columns are what queries select on and what a decision changes. Times
-- are Unix nanoseconds, as in the SQLite store.
CREATE TABLE holds (
	id              TEXT   PRIMARY KEY,
	status          TEXT   NOT NULL,
	agent           TEXT   NOT NULL,
	session         TEXT   NOT NULL,
	"user"          TEXT   NOT NULL,
	tool            TEXT   NOT NULL,
	sha256          TEXT   NOT NULL,
	created         BIGINT NOT NULL,
	expires         BIGINT NOT NULL,
	doc             BYTEA  NOT NULL,
	decided_by      TEXT   NOT NULL DEFAULT '',
	decision_reason TEXT   NOT NULL DEFAULT '',
	decided         BIGINT NOT NULL DEFAULT 0,
	result          BYTEA
);
CREATE INDEX holds_status ON holds (status, expires);
CREATE INDEX holds_caller ON holds (agent, status);
CREATE INDEX holds_same ON holds (agent, session, "user", tool, sha256, status);
CREATE INDEX holds_created ON holds (created DESC);
