package gateway

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
)

// TestPlaceholdersAuth: GET /api/v1/placeholders on the admin listener
// answers only sandboxd (a token of gateway.session_tokens_sha256) or an
// approver; anyone else gets 401 unauthenticated with the admin API's JSON
// error and no placeholder in the body. GET /ca.pem stays public (it is a
// certificate).
func TestPlaceholdersAuth(t *testing.T) {
	up := newUpstream(t)
	g := startHolds(t, up, "", func(c *config.Config) {
		c.Gateway.SessionTokensSHA256 = []string{tokenHash("tok-other"), tokenHash("tok-sandboxd")}
		c.Egress.Intercept = config.Intercept{Hosts: []string{"api.example.com"}, CADir: t.TempDir()}
		c.Egress.Placeholders = []config.Placeholder{{Secret: "tickets-key", Hosts: []string{"api.example.com"}, Header: "Authorization", Prefix: "Bearer "}}
	})
	if g.icpt == nil || len(g.icpt.Placeholders()) != 1 {
		t.Fatal("bug: the test gateway has no placeholder")
	}
	placeholder := g.icpt.Placeholders()[0].Placeholder

	cases := []struct {
		name, token string
		want        int
	}{
		{"no token", "", http.StatusUnauthorized},
		{"wrong token", "wrong", http.StatusUnauthorized},
		{"the token's hash as the token", tokenHash("tok-sandboxd"), http.StatusUnauthorized},
		{"session token (sandboxd)", "tok-sandboxd", http.StatusOK},
		{"second session token", "tok-other", http.StatusOK},
		{"approver token", "tok-carol", http.StatusOK},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := g.admin(t, tc.token, "GET", "/api/v1/placeholders", "")
			if r.status != tc.want {
				t.Fatalf("%d %s, want %d", r.status, r.raw, tc.want)
			}
			if tc.want == http.StatusUnauthorized {
				if r.code() != "unauthenticated" {
					t.Fatalf("code %q (%s), want unauthenticated", r.code(), r.raw)
				}
				if strings.Contains(r.raw, placeholder) {
					t.Fatal("a 401 carries the placeholder")
				}
				return
			}
			list, _ := r.body["placeholders"].([]any)
			if len(list) != 1 {
				t.Fatalf("placeholders %s, want one", r.raw)
			}
			if p, _ := list[0].(map[string]any); p["secret"] != "tickets-key" || p["placeholder"] != placeholder {
				t.Fatalf("placeholder entry %v", list[0])
			}
			if strings.Contains(r.raw, testSecret) {
				t.Fatal("the answer carries the secret's value")
			}
		})
	}

	t.Run("401 names the scheme", func(t *testing.T) {
		resp, err := http.Get("http://" + g.AdminAddr() + "/api/v1/placeholders")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Fatalf("%d WWW-Authenticate %q, want 401 Bearer", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
	})
	t.Run("ca.pem stays public", func(t *testing.T) {
		resp, err := http.Get("http://" + g.AdminAddr() + "/ca.pem")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK || !strings.HasPrefix(string(b), "-----BEGIN CERTIFICATE-----") {
			t.Fatalf("GET /ca.pem without a token: %d %.80q, want 200 and a certificate", resp.StatusCode, b)
		}
	})
}
