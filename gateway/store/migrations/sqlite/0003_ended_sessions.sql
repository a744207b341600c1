-- ended sessions (gateway/sessions.go). holds is the JSON list of
-- the hold ids the end expired.
CREATE TABLE ended_sessions (
	session  TEXT    PRIMARY KEY,
	ended    INTEGER NOT NULL,
	ended_by TEXT    NOT NULL,
	holds    TEXT    NOT NULL DEFAULT '[]'
) WITHOUT ROWID;
CREATE INDEX holds_session ON holds (session, status);
