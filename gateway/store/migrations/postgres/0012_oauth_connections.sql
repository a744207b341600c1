-- OAuth connections (gateway/oauth): a person's connection to a
-- credential.oauth2 connector, without its tokens, which stay in the
-- secret store (the local store, encrypted at rest, or Vault KV).
-- lease_owner and lease_until name the one gateway replica refreshing the
-- connection's tokens now (a refresh token used twice is revoked by many
-- providers); a lease ends when released or at lease_until.
CREATE TABLE oauth_connections (
	connector    TEXT    NOT NULL,
	"user"       TEXT    NOT NULL,
	status       TEXT    NOT NULL,
	scopes       TEXT    NOT NULL,
	connected_at BIGINT  NOT NULL,
	updated      BIGINT  NOT NULL,
	lease_owner  TEXT    NOT NULL DEFAULT '',
	lease_until  BIGINT  NOT NULL DEFAULT 0,
	PRIMARY KEY (connector, "user")
);
-- Connects started on the Connections page and not yet called back, so
-- the provider's redirect may reach any replica. id is the SHA-256 of the
-- state (the state itself is only in the person's browser and the
-- redirect), bind the SHA-256 of the review UI session, verifier the PKCE
-- verifier sealed with a key derived from the state: a reader of this
-- table can neither complete nor forge a connect.
CREATE TABLE oauth_pending (
	id        TEXT    PRIMARY KEY,
	connector TEXT    NOT NULL,
	"user"    TEXT    NOT NULL,
	bind      TEXT    NOT NULL,
	verifier  TEXT    NOT NULL,
	created   BIGINT  NOT NULL,
	expires   BIGINT  NOT NULL
);
CREATE INDEX oauth_pending_user ON oauth_pending ("user", created);
CREATE INDEX oauth_pending_expires ON oauth_pending (expires);
