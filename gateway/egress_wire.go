package gateway

import (
	"context"

	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/vault"
)

// The root's side of the seam with raw egress: what egress is given.

// newRawEgress provisions raw egress for this server.
func (s *Server) newRawEgress() *egress.Proxy { return egress.New(s.egressDeps()) }

// egressDeps wires raw egress to this server.
func (s *Server) egressDeps() egress.Deps {
	return egress.Deps{
		Config:   s.cfg,
		Log:      s.log,
		Dialer:   s.dialer,
		Identity: ingress.IdentityFrom,
		Engine:   s.engine.Load,
		Append:   s.appendAudit,
		Session:  s.sessionRefusal,
		Credential: func(ctx context.Context, secret string, c policy.Caller) (vault.Secret, error) {
			if tok, ok, err := s.placeholderToken(ctx, secret, c); ok { // oauthcreds.go
				return tok, err
			}
			return s.creds.Credential(ctx, CredentialRef{Connector: "egress", Secret: secret, Caller: c})
		},
		Track:            s.sessConns.add,
		OnStop:           s.stop.OnStop,
		AtClose:          s.stop.AtClose,
		Repeats:          s.repeats.allow,
		Interceptor:      s.icpt,
		Meter:            s.tel.provider.Meter("sluice/gateway/egress"),
		Decisions:        s.tel.decisions,
		Reflected:        s.tel.reflected,
		AuditFailures:    s.tel.audits,
		RuleLabel:        s.tel.ruleLabel,
		UpstreamAnswered: s.tel.upstreamAnswered,
	}
}
