package creds

import (
	"context"
	"net/http"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/vault"
)

// Deps is what the credential stage is handed by the gateway.
type Deps struct {
	Source Source
	// OAuth holds the tokens of the credential.oauth2 connectors; nil
	// without any.
	OAuth *oauth.Manager
	// ConnectionsURL is the review UI's page where a person connects
	// connector: a refused call names it.
	ConnectionsURL func(connector string) string
}

// Creds is the credential stage of the tool call pipeline.
type Creds struct{ d Deps }

// New returns the credential stage over d.
func New(d Deps) *Creds { return &Creds{d: d} }

// Call is what the stage needs of one call: the operation, who it is for,
// and its connector's credential (nil: none) with the plan NewPlan made.
type Call struct {
	Tool   *connectors.Tool
	Caller policy.Caller
	Cred   *config.Credential
	Plan   *Plan
}

// Attach fetches the call's credential and puts it on req where the
// caller never sees it. The Attachment's Where is what the audit record
// says (with the OAuth connection and its scopes, never a value); its
// Forms are what the reply's scrubber must find. Without a credential it
// returns the zero Attachment. Every failure is a refusal: 503
// credential_unavailable, or 403 connection_required naming where a
// person connects.
func (s *Creds) Attach(ctx context.Context, c Call, req *http.Request) (Attachment, *refusal.Error) {
	cc := c.Cred
	if cc == nil {
		return Attachment{}, nil
	}
	ref := Ref{Connector: c.Tool.Connector, Secret: cc.Secret, Vault: cc.Vault, Caller: c.Caller, Tool: c.Tool.Name}
	if cc.Vault != nil && cc.Vault.TransitKey != "" {
		h, err := RequestHash(req)
		if err != nil {
			return Attachment{}, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the request cannot be hashed for its per-call token").Wrap(err)
		}
		ref.RequestSHA256 = h
	}
	var secret vault.Secret
	var err error
	var conn string // an OAuth connection and its scopes, for the record
	if cc.OAuth2 != nil {
		var e *refusal.Error
		if secret, conn, e = s.oauthToken(ctx, c.Tool, c.Caller.User); e != nil {
			return Attachment{}, e
		}
	} else {
		secret, err = s.d.Source.Credential(ctx, ref)
	}
	if err != nil {
		return Attachment{}, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the credential for this connector is unavailable").Wrap(err)
	}
	att, err := Attach(req, c.Plan, c.Tool, secret)
	if err != nil {
		return Attachment{}, refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the credential cannot be attached to this operation").Wrap(err)
	}
	if conn != "" {
		att.Where += " (" + conn + ")"
	}
	return att, nil
}
