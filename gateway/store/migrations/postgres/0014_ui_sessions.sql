-- Review UI sessions (gateway/review), so that a person signed in on one
-- replica is signed in on all and a sign-out on any is final on all.
-- id_hash is the SHA-256 (hex) of the session id; the id itself is only
-- in the person's cookie, so a reader of this table cannot act as anyone.
-- A session is live while now < expires (the absolute lifetime) and
-- now < last_seen + idle (the idle timeout), both read from the row.
-- Times are Unix nanoseconds of the gateways' clocks, idle nanoseconds.
CREATE TABLE ui_sessions (
	id_hash   TEXT    PRIMARY KEY,
	person    TEXT    NOT NULL,
	member_of TEXT    NOT NULL,
	method    TEXT    NOT NULL,
	created   BIGINT  NOT NULL,
	last_seen BIGINT  NOT NULL,
	expires   BIGINT  NOT NULL,
	idle      BIGINT  NOT NULL
);
CREATE INDEX ui_sessions_expires ON ui_sessions (expires);
