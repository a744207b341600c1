package vault

import (
	"context"
	"fmt"
	"strings"
)

// NamedKV reads and writes named secrets in Vault KV v2 where Named finds
// them (KVMount/data/KVPrefix/<scope>/<name>, field "value"), with the
// local store's Get, Set and Delete: for values the gateway itself keeps
// and rotates (a person's OAuth tokens). Reads are never cached (a
// rotated value written by another replica must be seen at once), and
// Delete removes every version (KV v2 metadata), so nothing of a deleted
// value stays readable.
type NamedKV struct{ V *Vault }

func (n NamedKV) paths(name string, scope Scope) (data, meta string, err error) {
	if err := validateName(name); err != nil {
		return "", "", fmt.Errorf("vault: %w", err)
	}
	if err := scope.validate(); err != nil {
		return "", "", fmt.Errorf("vault: %w", err)
	}
	rest := n.V.cfg.KVPrefix + "/" + strings.Replace(string(scope), ":", "/", 1) + "/" + name
	return n.V.cfg.KVMount + "/data/" + rest, n.V.cfg.KVMount + "/metadata/" + rest, nil
}

// Get returns the value, or an error wrapping ErrNotFound.
func (n NamedKV) Get(ctx context.Context, name string, scope Scope) (Secret, error) {
	data, _, err := n.paths(name, scope)
	if err != nil {
		return Secret{}, err
	}
	sec, err := n.V.read(ctx, data)
	if err != nil {
		return Secret{}, err
	}
	if sec != nil {
		if inner, ok := sec.Data["data"].(map[string]any); ok {
			if s, ok := inner["value"].(string); ok {
				if err := ValidateValue([]byte(s)); err != nil {
					return Secret{}, fmt.Errorf("vault: %s field \"value\": %w", data, err)
				}
				return NewSecret([]byte(s)), nil
			}
		}
	}
	return Secret{}, fmt.Errorf("vault: %q at scope %s: %w", name, scope, ErrNotFound)
}

// Set writes value as a new version (one write: a reader sees the old
// value or the new, never a part).
func (n NamedKV) Set(ctx context.Context, name string, scope Scope, value Secret) error {
	data, _, err := n.paths(name, scope)
	if err != nil {
		return err
	}
	if err := ValidateValue(value.Reveal()); err != nil {
		return err
	}
	_, err = n.V.write(ctx, data, map[string]any{"data": map[string]any{"value": string(value.Reveal())}})
	return err
}

// Delete removes the secret and every version of it; none is not an error.
func (n NamedKV) Delete(ctx context.Context, name string, scope Scope) error {
	_, meta, err := n.paths(name, scope)
	if err != nil {
		return err
	}
	if _, err := n.V.client.Logical().DeleteWithContext(ctx, meta); err != nil {
		return vaultErr("delete", meta, err)
	}
	return nil
}
