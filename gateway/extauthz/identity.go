package extauthz

import (
	"fmt"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Identity sources (Request.IdentitySource).
const (
	FromPrincipal         = "principal"
	FromContextExtensions = "context_extensions"
)

// Context extension keys, as in the identity preamble.
const (
	KeySandbox = "sandbox"
	KeyAgent   = "agent"
	KeySession = "session"
	KeyUser    = "user"
)

// IdentityError says why a CheckRequest carries no usable identity.
type IdentityError struct{ Reason string }

func (e *IdentityError) Error() string { return "extauthz: identity: " + e.Reason }

// Identify returns the identity a CheckRequest carries and where it came
// from. Only two places count, both written by Envoy rather than by the
// client: the downstream peer's mTLS principal (attributes.source.principal,
// a SPIFFE ID) when principals lists it, and the context_extensions of
// Envoy's configuration (keys sandbox, agent, session, user). Request
// headers never count: the sandbox writes them. When both are present they
// must agree; with neither, or without an agent, there is no identity.
func Identify(cr *authv3.CheckRequest, principals map[string]config.ExtAuthzPrincipal) (wire.Identity, string, error) {
	a := cr.GetAttributes()
	var fromP, fromX *wire.Identity
	if pr := a.GetSource().GetPrincipal(); pr != "" {
		if p, ok := principals[pr]; ok {
			fromP = &wire.Identity{Sandbox: p.Sandbox, Agent: p.Agent, Session: p.Session, User: p.User}
		}
	}
	ce := a.GetContextExtensions()
	if ce[KeySandbox] != "" || ce[KeyAgent] != "" || ce[KeySession] != "" || ce[KeyUser] != "" {
		fromX = &wire.Identity{Sandbox: ce[KeySandbox], Agent: ce[KeyAgent], Session: ce[KeySession], User: ce[KeyUser]}
	}
	switch {
	case fromP != nil && fromX != nil:
		for _, kv := range [][3]string{
			{KeySandbox, fromP.Sandbox, fromX.Sandbox}, {KeyAgent, fromP.Agent, fromX.Agent},
			{KeySession, fromP.Session, fromX.Session}, {KeyUser, fromP.User, fromX.User},
		} {
			if kv[1] != "" && kv[2] != "" && kv[1] != kv[2] {
				return wire.Identity{}, "", &IdentityError{Reason: fmt.Sprintf("the source principal and context_extensions disagree on %s", kv[0])}
			}
		}
		id := *fromP
		fill(&id.Sandbox, fromX.Sandbox)
		fill(&id.Session, fromX.Session)
		fill(&id.User, fromX.User)
		return check(id, FromPrincipal)
	case fromP != nil:
		return check(*fromP, FromPrincipal)
	case fromX != nil:
		return check(*fromX, FromContextExtensions)
	}
	if a.GetSource().GetPrincipal() != "" {
		return wire.Identity{}, "", &IdentityError{Reason: "the source principal is not in gateway.ext_authz.principals and Envoy sent no context_extensions"}
	}
	return wire.Identity{}, "", &IdentityError{Reason: "no mTLS source principal and no context_extensions (sandbox, agent, session, user) from Envoy's configuration"}
}

func fill(dst *string, v string) {
	if *dst == "" {
		*dst = v
	}
}

func check(id wire.Identity, src string) (wire.Identity, string, error) {
	if id.Agent == "" {
		return wire.Identity{}, "", &IdentityError{Reason: "no agent in the " + src}
	}
	if id.Sandbox == "" {
		id.Sandbox = "envoy:" + id.Agent
	}
	return id, src, nil
}
