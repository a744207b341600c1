package oauth

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluice-gw/sluice/vault"
)

// LocalStore keeps each connection as one secret of the embedded local
// store (encrypted at rest), named "oauth2.CONNECTOR" at the person's scope
// user:NAME. A save is one atomic write of the store file, so an access
// token and the refresh token it was rotated with are never apart.
type LocalStore struct{ Local *vault.Local }

func secretName(connector string) string { return "oauth2." + connector }

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
		// Sealed under this name and scope (AEAD associated data), so only
		// a bug writes it elsewhere.
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
