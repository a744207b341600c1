-- held calls (gateway/holds). doc is the immutable part as JSON; the
-- columns are what queries select on and what a decision changes.
CREATE TABLE holds (
	id              TEXT    PRIMARY KEY,
	status          TEXT    NOT NULL,
	agent           TEXT    NOT NULL,
	session         TEXT    NOT NULL,
	user            TEXT    NOT NULL,
	tool            TEXT    NOT NULL,
	sha256          TEXT    NOT NULL,
	created         INTEGER NOT NULL,
	expires         INTEGER NOT NULL,
	doc             BLOB    NOT NULL,
	decided_by      TEXT    NOT NULL DEFAULT '',
	decision_reason TEXT    NOT NULL DEFAULT '',
	decided         INTEGER NOT NULL DEFAULT 0,
	result          BLOB
);
CREATE INDEX holds_status ON holds (status, expires);
CREATE INDEX holds_caller ON holds (agent, status);
CREATE INDEX holds_same ON holds (agent, session, user, tool, sha256, status);
CREATE INDEX holds_created ON holds (created DESC);
