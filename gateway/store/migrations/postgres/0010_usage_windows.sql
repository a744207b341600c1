-- input.usage: calls of a tool and the sum of one numeric argument, per
-- agent, user and session (scope, who), in one-minute buckets (minute:
-- Unix minutes). The 1 min / 1 h / 1 day windows are the sums of the last
-- 1, 60 and 1440 buckets. A call is counted (an upsert) in the same
-- transaction that reads its windows, so the count a decision sees is
-- every call decided before it plus itself. Buckets older than a day are
-- removed as new ones are written.
CREATE TABLE usage_windows (
	scope  TEXT             NOT NULL,
	who    TEXT             NOT NULL,
	tool   TEXT             NOT NULL,
	minute BIGINT           NOT NULL,
	count  BIGINT           NOT NULL,
	total  DOUBLE PRECISION NOT NULL,
	PRIMARY KEY (scope, who, tool, minute)
);
