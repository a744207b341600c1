// Package creds is the credential stage of a tool call: where a
// connector's credential comes from (the local store or Vault), how it is
// put on a request (the plan decided once from the config and the spec,
// then per call from the value), and the checks `sluice validate` makes of
// the secrets the configuration names. It never imports the gateway root:
// the root builds a Source and a Plan per connector and calls Attach.
package creds

import (
	"context"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/vault"
)

// Ref names the credential a connector's calls carry.
type Ref struct {
	Connector string
	Secret    string           // a named secret, or
	Vault     *config.VaultRef // a Vault credential (secrets.backend: vault)
	Caller    policy.Caller
	// Tool and RequestSHA256 describe the call the credential is for
	// (per-call tokens carry them as claims). RequestSHA256 is RequestHash
	// of the request as it will be sent, before the credential is attached.
	Tool          string
	RequestSHA256 string
}

// Source fetches credentials. The returned secret lives only in the
// gateway process; errors must not contain secret values.
type Source interface {
	Credential(ctx context.Context, ref Ref) (vault.Secret, error)
}

// OAuthScheme is how an OAuth access token is attached: the Authorization
// header, as every oauth2 securityScheme sends it (RFC 6750 2.1).
var OAuthScheme = &connectors.SecurityScheme{Name: "credential.oauth2", Type: "http", Scheme: "bearer"}
