-- usage counters per hour.
CREATE TABLE usage (
	hour   TEXT    NOT NULL,
	agent  TEXT    NOT NULL,
	tool   TEXT    NOT NULL,
	action TEXT    NOT NULL,
	count  INTEGER NOT NULL,
	PRIMARY KEY (hour, agent, tool, action)
) WITHOUT ROWID;
CREATE INDEX usage_hour ON usage (hour DESC);
