package remotes

import (
	"context"
	"errors"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/vault"
)

// refusingSource records what it was asked for and refuses with an error
// that names a secret.
type refusingSource struct{ asked []creds.Ref }

func (s *refusingSource) Credential(_ context.Context, ref creds.Ref) (vault.Secret, error) {
	s.asked = append(s.asked, ref)
	return vault.Secret{}, errors.New("vault said: token s3cr3t-value denied")
}

// TestHeaderActsForListUser: a listing has no caller, so a per-user
// credential is fetched for list_user alone; without one the listing is
// refused before the source is asked; a source's failure is reported
// without its error (which may name a secret); no credential, no header.
func TestHeaderActsForListUser(t *testing.T) {
	base, _ := url.Parse("https://mcp.example/mcp")
	perUser := &config.Credential{Vault: &config.VaultRef{KV: "secret/data/{user}/mcp"}, Header: "Authorization", Prefix: "Bearer "}
	ctx := context.Background()

	src := &refusingSource{}
	h := Header(src, Server{Connector: config.Connector{Slug: "remote", Credential: perUser}, BaseURL: base})
	if _, err := h(ctx); err == nil || !strings.Contains(err.Error(), "set list_user") || len(src.asked) != 0 {
		t.Fatalf("per-user credential without list_user: err %v, source asked %v; want refused before asking", err, src.asked)
	}

	h = Header(src, Server{Connector: config.Connector{Slug: "remote", Credential: perUser, ListUser: "svc-lister"}, BaseURL: base})
	_, err := h(ctx)
	if err == nil || strings.Contains(err.Error(), "s3cr3t") || !strings.Contains(err.Error(), "connector remote is unavailable") {
		t.Fatalf("source failure: err %v; want unavailable, without the source's error", err)
	}
	if len(src.asked) != 1 || src.asked[0].Caller.User != "svc-lister" || src.asked[0].Connector != "remote" {
		t.Fatalf("source asked %+v; want connector remote for user svc-lister", src.asked)
	}

	if h := Header(src, Server{Connector: config.Connector{Slug: "open"}, BaseURL: base}); h != nil {
		t.Fatal("a connector without a credential got a listing header")
	}
}
