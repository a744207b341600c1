-- usage counters per hour.
CREATE TABLE usage (
	hour   TEXT   NOT NULL,
	agent  TEXT   NOT NULL,
	tool   TEXT   NOT NULL,
	action TEXT   NOT NULL,
	count  BIGINT NOT NULL,
	PRIMARY KEY (hour, agent, tool, action)
);
CREATE INDEX usage_hour ON usage (hour DESC);
