package remotes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/checks"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/connections"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/vault"
)

// A provider: mcp connector with credential.oauth2 is a remote MCP server
// that speaks MCP authorization: the gateway is its OAuth client per
// person (gateway/oauth/discover.go finds the authorization server from
// the server's metadata and registers a client when none is configured),
// each person connects on the Connections page like any
// credential.oauth2 connector, and a call carries the caller's own token
// in a session of its own (mcpremote.Options.PerCredential). The tool
// list has no caller: it is fetched with the token of a person who has
// connected (the most recently updated connection that still works).

// EventAuthorizationRefused is the audit event of a remote MCP
// server whose authorization metadata the gateway refused (another
// resource, another issuer, plain http, no PKCE…): the connector, the
// step and the reason. Its tools stay unavailable; nothing is sent.
const EventAuthorizationRefused = "mcp_authorization_refused"

// OAuthClient is the OAuth client of a provider: mcp connector with
// credential.oauth2: its endpoints (and, without client_id, the client)
// are discovered; plain http is allowed only inside allow_private.
func OAuthClient(cc config.Connector, allow []netip.Prefix) *oauth.Client {
	o := cc.Credential.OAuth2
	return &oauth.Client{Connector: cc.Slug, Flow: oauth.AuthorizationCode, ClientID: o.ClientID,
		Scopes: slices.Clone(o.Scopes), RevocationURL: o.RevocationURL, Resource: cc.URL,
		Discovery: &oauth.Discovery{PlainOK: func(host string) bool { return creds.PlaintextOK(host, allow) }, ClientName: "sluice (" + cc.Slug + ")"}}
}

// OAuthHeader is how a remote MCP server with MCP authorization is
// listed: its authorization discovered (a failure is the remote's
// unavailability reason, by step), then the token of a person who has
// connected it. m is the OAuth manager, appendRec where a refused
// authorization is audited (the root's one audit write), src where the connections are listed, publicURL
// approvals.public_url (the Connections page named in the reason).
func OAuthHeader(m *oauth.Manager, appendRec Append, log *slog.Logger, src creds.Source, publicURL string) func(s Server) func(ctx context.Context) (http.Header, error) {
	return func(s Server) func(ctx context.Context) (http.Header, error) {
		return oauthListHeader(m, appendRec, log, src, publicURL, s.Connector)
	}
}

func oauthListHeader(m *oauth.Manager, appendRec Append, log *slog.Logger, src creds.Source, publicURL string, cc config.Connector) func(ctx context.Context) (http.Header, error) {
	slug := cc.Slug
	var mu sync.Mutex
	var last string // the refusal last audited, so a remote that stays refused is recorded once
	return func(ctx context.Context) (http.Header, error) {
		if m == nil {
			return nil, errors.New("bug(): the OAuth client of a remote MCP server is not set up")
		}
		err := m.Discover(ctx, slug)
		mu.Lock()
		var de *oauth.DiscoveryError
		if errors.As(err, &de) && de.Reason != last {
			last = de.Reason
			f := map[string]any{"connector": slug, "url": config.RedactURL(cc.URL), "step": de.Step, "reason": de.Reason}
			if _, aerr := appendRec(ctx, audit.Record{RequestID: refusal.NewRequestID(), Event: EventAuthorizationRefused, Fields: f}, false); aerr != nil {
				log.Error("audit: a remote MCP server's refused authorization could not be recorded", "connector", slug, "err", aerr)
			}
		} else if err == nil {
			last = ""
		}
		mu.Unlock()
		if err != nil {
			return nil, err
		}
		users, err := connectedUsers(ctx, src, slug)
		if err != nil {
			return nil, err
		}
		for _, u := range users {
			tok, err := m.Token(ctx, slug, u)
			if err != nil {
				continue // needs reconnecting, or refused: the next person's
			}
			return http.Header{"Authorization": {"Bearer " + string(tok.Value)}}, nil
		}
		return nil, fmt.Errorf("no person has a working connection to %s yet (MCP authorization: its tools are listed with a person's token); connect at %s", slug, connections.URL(publicURL)(slug))
	}
}

// connectedUsers are the people with a stored connection to connector,
// the most recently updated first.
func connectedUsers(ctx context.Context, src creds.Source, connector string) ([]string, error) {
	ls, ok := src.(creds.Local)
	if !ok {
		return nil, errors.New("MCP authorization keeps connections in the local store; it needs secrets.backend: local")
	}
	es, err := ls.Store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("the connections cannot be listed: %w", err)
	}
	slices.SortStableFunc(es, func(a, b vault.Entry) int { return strings.Compare(b.Updated, a.Updated) })
	var users []string
	for _, e := range es {
		if u, ok := strings.CutPrefix(string(e.Scope), "user:"); ok && e.Name == "oauth2."+connector {
			users = append(users, u)
		}
	}
	return users, nil
}

// CheckOAuth is validate's look at a remote MCP server with MCP
// authorization: its metadata discovered as serve would (nothing is
// registered), and reported as a warning either way: the tools are listed
// only once a person connects, and a server whose authorization cannot be
// discovered is served unavailable (serve keeps trying).
func CheckOAuth(ctx context.Context, key string, cc config.Connector, allow []netip.Prefix, transport http.RoundTripper) error {
	d := &oauth.Discovery{PlainOK: func(host string) bool { return creds.PlaintextOK(host, allow) }}
	hc := &http.Client{Transport: transport, Timeout: 15 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	rm, err := d.ResourceMetadata(ctx, hc, cc.Slug, cc.URL)
	if err != nil {
		return checks.Warnf("%s.credential.oauth2: the remote MCP server's authorization cannot be discovered: %v; serve lists it unavailable and tries again", key, err)
	}
	var why []string
	for _, issuer := range rm.AuthorizationServers {
		sm, err := d.ServerMetadata(ctx, hc, cc.Slug, issuer)
		if err != nil {
			why = append(why, err.Error())
			continue
		}
		if cc.Credential.OAuth2.ClientID == "" && sm.RegistrationEndpoint == "" {
			return checks.Warnf("%s.credential.oauth2.client_id: must be set: the authorization server %s offers no dynamic client registration (RFC 7591)", key, sm.Issuer)
		}
		return checks.Warnf("%s: the remote MCP server speaks MCP authorization (authorization server %s); its tools are listed once a person connects it on the Connections page", key, sm.Issuer)
	}
	return checks.Warnf("%s.credential.oauth2: no authorization server of the remote MCP server is usable: %s; serve lists it unavailable and tries again", key, strings.Join(why, "; "))
}
