-- Review UI sign-ins through OIDC that were started and not yet finished
-- (gateway/review/oidc.go), so that the provider's redirect may land on
-- any replica. id_hash is the SHA-256 (hex) of the random id in the
-- browser's sluice_oidc cookie; sealed is the state, nonce and PKCE
-- verifier sealed under a key derived from that id, which is never
-- stored: a reader of this table can neither find nor finish a sign-in.
-- Rows live 10 minutes; each is taken (deleted) once. Times are Unix
-- nanoseconds of the gateway's clock.
CREATE TABLE ui_oidc_pending (
	id_hash TEXT    PRIMARY KEY,
	sealed  TEXT    NOT NULL,
	created INTEGER NOT NULL,
	expires INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX ui_oidc_pending_created ON ui_oidc_pending (created);
