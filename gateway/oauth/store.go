package oauth

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-gw/sluice/vault"
)

// Row is a connection without its tokens: what the gateway's store keeps
// in its oauth_connections table, readable by every replica.
type Row struct {
	Connector   string
	User        string
	Status      Status // Connected or NeedsReconnect
	Scopes      []string
	ConnectedAt time.Time
}

// Rows keeps connections' rows (the gateway's store). Get returns
// ErrNoConnection when there is none; Put with onlyNew stores r only when
// there is no row yet and reports whether it did.
type Rows interface {
	Get(ctx context.Context, connector, user string) (Row, error)
	Put(ctx context.Context, r Row, onlyNew bool) (bool, error)
	Delete(ctx context.Context, connector, user string) error
}

// SecretKV is a secret store that the gateway writes: the embedded local
// store (*vault.Local) or Vault KV v2 (vault.NamedKV). Get wraps
// vault.ErrNotFound when there is nothing.
type SecretKV interface {
	Get(ctx context.Context, name string, scope vault.Scope) (vault.Secret, error)
	Set(ctx context.Context, name string, scope vault.Scope, value vault.Secret) error
	Delete(ctx context.Context, name string, scope vault.Scope) error
}

// SplitStore is the Store of a gateway: each connection's row in Rows,
// its tokens in Secrets as one secret named "oauth2.CONNECTOR" at the
// person's scope user:NAME (encrypted at rest by the local store, or in
// Vault KV), written in one write, so an access token and the refresh
// token it was rotated with are never apart.
//
// A connection whose row is missing but whose secret holds the whole
// connection (what builds before the oauth_connections table wrote) is
// moved on first read: its row is written from the secret and the secret
// rewritten with the tokens only.
type SplitStore struct {
	Rows    Rows
	Secrets SecretKV
}

// tokens is the secret's form: the tokens and what ties them to their
// name and scope. A record written before the table existed also holds
// the row's fields (Status set).
type tokens struct {
	Connector string    `json:"connector"`
	User      string    `json:"user"`
	Access    string    `json:"access,omitempty"`
	Refresh   string    `json:"refresh,omitempty"`
	Expiry    time.Time `json:"expiry"`
	// Only in records of older builds:
	Status      Status    `json:"status,omitempty"`
	Scopes      []string  `json:"scopes,omitempty"`
	ConnectedAt time.Time `json:"connected_at"`
}

func secretName(connector string) string { return "oauth2." + connector }

func (s SplitStore) loadTokens(ctx context.Context, connector, user string) (tokens, bool, error) {
	v, err := s.Secrets.Get(ctx, secretName(connector), vault.UserScope(user))
	if errors.Is(err, vault.ErrNotFound) {
		return tokens{}, false, nil
	}
	if err != nil {
		return tokens{}, false, err
	}
	var t tokens
	if err := json.Unmarshal(v.Reveal(), &t); err != nil {
		return tokens{}, false, errors.New("oauth: stored tokens are not readable")
	}
	if t.Connector != connector || t.User != user {
		// Sealed under this name and scope (AEAD associated data, or the
		// Vault path), so only a bug writes it elsewhere.
		return tokens{}, false, fmt.Errorf("bug(): oauth: stored tokens of %s/%s are not %s/%s", t.Connector, t.User, connector, user)
	}
	return t, true, nil
}

func (s SplitStore) saveTokens(ctx context.Context, c Connection) error {
	b, err := json.Marshal(tokens{Connector: c.Connector, User: c.User, Access: c.Access, Refresh: c.Refresh, Expiry: c.Expiry})
	if err != nil {
		return err
	}
	return s.Secrets.Set(ctx, secretName(c.Connector), vault.UserScope(c.User), vault.NewSecret(b))
}

func (s SplitStore) deleteTokens(ctx context.Context, connector, user string) error {
	err := s.Secrets.Delete(ctx, secretName(connector), vault.UserScope(user))
	if errors.Is(err, vault.ErrNotFound) {
		return nil
	}
	return err
}

// Load implements Store.
func (s SplitStore) Load(ctx context.Context, connector, user string) (Connection, error) {
	r, err := s.Rows.Get(ctx, connector, user)
	if errors.Is(err, ErrNoConnection) {
		return s.moveOld(ctx, connector, user)
	}
	if err != nil {
		return Connection{}, err
	}
	c := Connection{Connector: connector, User: user, Status: r.Status, Scopes: r.Scopes, ConnectedAt: r.ConnectedAt}
	if c.Status != Connected {
		return c, nil
	}
	t, ok, err := s.loadTokens(ctx, connector, user)
	if err != nil {
		return Connection{}, err
	}
	if ok {
		c.Access, c.Refresh, c.Expiry = t.Access, t.Refresh, t.Expiry
	}
	// No tokens under a connected row (deleted from the secret store by
	// hand): no token to send and none to refresh, so the person
	// reconnects.
	return c, nil
}

// moveOld moves a connection an older build stored whole in the secret
// store into a row and a tokens-only secret.
func (s SplitStore) moveOld(ctx context.Context, connector, user string) (Connection, error) {
	t, ok, err := s.loadTokens(ctx, connector, user)
	if err != nil {
		return Connection{}, err
	}
	if !ok || t.Status == "" {
		// Nothing, or tokens whose row is gone (a disconnect that failed
		// half-way): not a connection.
		return Connection{}, ErrNoConnection
	}
	c := Connection{Connector: connector, User: user, Status: t.Status, Scopes: t.Scopes, ConnectedAt: t.ConnectedAt,
		Access: t.Access, Refresh: t.Refresh, Expiry: t.Expiry}
	if c.Status != Connected && c.Status != NeedsReconnect {
		return Connection{}, fmt.Errorf("oauth: stored connection %s has an unknown status", c)
	}
	if _, err := s.Rows.Put(ctx, Row{Connector: connector, User: user, Status: c.Status, Scopes: c.Scopes, ConnectedAt: c.ConnectedAt}, true); err != nil {
		return Connection{}, fmt.Errorf("oauth: move stored connection %s to the store: %w", c, err)
	}
	// Another replica may have moved (and since refreshed) it first: the
	// row and the tokens are read again, as any connection's.
	if err := s.rewriteOld(ctx, c); err != nil {
		return Connection{}, err
	}
	return s.Load(ctx, connector, user)
}

// rewriteOld drops the row's fields from an old record, unless the secret
// changed meanwhile (then whoever changed it wrote the new form).
func (s SplitStore) rewriteOld(ctx context.Context, c Connection) error {
	t, ok, err := s.loadTokens(ctx, c.Connector, c.User)
	if err != nil || !ok || t.Status == "" || t.Refresh != c.Refresh || t.Access != c.Access {
		return err
	}
	if c.Status != Connected {
		return s.deleteTokens(ctx, c.Connector, c.User)
	}
	return s.saveTokens(ctx, c)
}

// Save implements Store: the tokens first (one write), then the row; a
// connection that is not connected keeps no tokens.
func (s SplitStore) Save(ctx context.Context, c Connection) error {
	if c.Status == Connected {
		if err := s.saveTokens(ctx, c); err != nil {
			return err
		}
	} else if err := s.deleteTokens(ctx, c.Connector, c.User); err != nil {
		return err
	}
	_, err := s.Rows.Put(ctx, Row{Connector: c.Connector, User: c.User, Status: c.Status, Scopes: c.Scopes, ConnectedAt: c.ConnectedAt}, false)
	return err
}

// Delete implements Store: the tokens first, so a failure between the two
// leaves a row without tokens (needs reconnecting), never tokens that a
// missing row hides from Disconnect.
func (s SplitStore) Delete(ctx context.Context, connector, user string) error {
	if err := s.deleteTokens(ctx, connector, user); err != nil {
		return err
	}
	return s.Rows.Delete(ctx, connector, user)
}

// LocalStore is the store of builds before the oauth_connections table:
// the whole connection as one secret of the local store. It remains for
// tests that write what those builds wrote.
type LocalStore struct{ Local *vault.Local }

// Load implements Store.
func (s LocalStore) Load(ctx context.Context, connector, user string) (Connection, error) {
	v, err := s.Local.Get(ctx, secretName(connector), vault.UserScope(user))
	if errors.Is(err, vault.ErrNotFound) {
		return Connection{}, ErrNoConnection
	}
	if err != nil {
		return Connection{}, err
	}
	c, err := Decode(v.Reveal())
	if err != nil {
		return Connection{}, err
	}
	if c.Connector != connector || c.User != user {
		return Connection{}, fmt.Errorf("bug(): oauth: stored connection %s is not %s/%s", c, connector, user)
	}
	return c, nil
}

// Save implements Store.
func (s LocalStore) Save(ctx context.Context, c Connection) error {
	b, err := Encode(c)
	if err != nil {
		return err
	}
	return s.Local.Set(ctx, secretName(c.Connector), vault.UserScope(c.User), vault.NewSecret(b))
}

// Delete implements Store.
func (s LocalStore) Delete(ctx context.Context, connector, user string) error {
	err := s.Local.Delete(ctx, secretName(connector), vault.UserScope(user))
	if errors.Is(err, vault.ErrNotFound) {
		return nil
	}
	return err
}
