-- token buckets shared by the gateways of one database (agents[].rate_limit
-- per sandbox, across replicas): tokens as of updated (server clock, Unix
-- nanoseconds), refilled on each take.
CREATE TABLE rate_buckets (
	key     TEXT             PRIMARY KEY,
	tokens  DOUBLE PRECISION NOT NULL,
	updated BIGINT           NOT NULL
);
