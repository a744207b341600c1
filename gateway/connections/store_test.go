package connections

import (
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/oauth"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/vault"
)

// TestOAuthOldStoreMoves: connections stored the way builds before the
// oauth_connections table stored them (the whole connection, tokens and
// all, as one local-store secret) are found by this build: the row is
// written from the secret on first read, the secret keeps the tokens
// only, and the access token still serves.
func TestOAuthOldStoreMoves(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	local, err := vault.OpenLocal(filepath.Join(dir, "secrets.json"), filepath.Join(dir, "key"))
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)
	old := oauth.LocalStore{Local: local} // what the old code path wrote with
	for _, c := range []oauth.Connection{
		{Connector: "docs", User: "alice", Status: oauth.Connected, Scopes: []string{"openid", "offline_access"}, ConnectedAt: at,
			Access: "at-alice-0123456789", Refresh: "rt-alice-0123456789", Expiry: time.Now().Add(time.Hour)},
		{Connector: "docs", User: "bob", Status: oauth.NeedsReconnect, Scopes: []string{"openid"}, ConnectedAt: at},
	} {
		if err := old.Save(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	st, err := store.Open(ctx, "sqlite:"+filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	get := func() *store.Store { return st }
	split := oauth.SplitStore{Rows: Rows{get}, Secrets: local}
	m, err := oauth.New(oauth.Options{Store: split, RedirectURL: "http://sluice.test/connections/callback", Pending: Pending{get}, Lease: Lease{get},
		Clients: []oauth.Client{{Connector: "docs", Flow: oauth.AuthorizationCode, ClientID: "c", AuthURL: "http://127.0.0.1:1/auth", TokenURL: "http://127.0.0.1:1/token", HTTP: http.DefaultClient}}})
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Get(ctx, "docs", "alice")
	if err != nil || a.Status != oauth.Connected || !a.ConnectedAt.Equal(at) || strings.Join(a.Scopes, " ") != "openid offline_access" {
		t.Fatalf("alice = %+v, %v", a, err)
	}
	if b, err := m.Get(ctx, "docs", "bob"); err != nil || b.Status != oauth.NeedsReconnect {
		t.Fatalf("bob = %+v, %v", b, err)
	}
	tok, err := m.Token(ctx, "docs", "alice")
	if err != nil || string(tok.Value) != "at-alice-0123456789" {
		t.Fatalf("token after the move: %v", err)
	}
	// Moved: the rows are in the table, the secret holds tokens only, and
	// bob's (needs_reconnect) holds none.
	for _, who := range []string{"alice", "bob"} {
		if _, err := st.GetOAuthConnection(ctx, "docs", who); err != nil {
			t.Fatalf("%s's row: %v", who, err)
		}
	}
	v, err := local.Get(ctx, "oauth2.docs", vault.UserScope("alice"))
	if err != nil {
		t.Fatal(err)
	}
	var rec map[string]any
	if err := json.Unmarshal(v.Reveal(), &rec); err != nil {
		t.Fatal(err)
	}
	if rec["status"] != nil || rec["scopes"] != nil || rec["refresh"] != "rt-alice-0123456789" {
		t.Fatalf("alice's secret after the move has keys %v", slices.Collect(maps.Keys(rec)))
	}
	if _, err := local.Get(ctx, "oauth2.docs", vault.UserScope("bob")); !errors.Is(err, vault.ErrNotFound) {
		t.Fatalf("bob's needs_reconnect secret kept: %v", err)
	}
}
