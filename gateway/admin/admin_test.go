package admin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/policy"
)

// TestOptionalDepsOff: the admin API with every optional dependency nil
// (no holds manager, no interception CA, no receipts signer, no review
// UI) and no policy loaded answers each route as Deps documents — 503
// approval_unavailable, 404 not_found, /readyz 503 naming both policy
// problems — and still authenticates first (401 before 503); nothing is
// audited for a refused request. The routes' full
// behaviour over a real gateway is tested in the root.
func TestOptionalDepsOff(t *testing.T) {
	sum := sha256.Sum256([]byte("tok-bob"))
	cfg := config.Defaults()
	cfg.Approvers.Users = []config.User{{Name: "bob", TokenSHA256: hex.EncodeToString(sum[:])}}
	var audited []audit.Record
	a := New(Deps{
		Config: cfg, Log: slog.New(slog.DiscardHandler),
		Audit:        func(_ context.Context, r audit.Record) error { audited = append(audited, r); return nil },
		Policy:       func() *policy.Engine { return nil },
		PolicyErr:    func() string { return "rego: 1 error occurred" },
		AuditErr:     func() error { return nil },
		StoreProblem: func(context.Context) string { return "" },
		Metrics:      http.NotFoundHandler(), JWKS: http.NotFoundHandler(),
		Tools:        func() int { return 0 },
		Placeholders: func() any { return []string{} },
		CloseSession: func(string) int { return 0 },
	})
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	for _, tc := range []struct {
		name, method, path, token string
		status                    int
		code, says                string
	}{
		{"holds without a person", "GET", "/api/v1/holds", "", 401, "unauthenticated", "approver token"},
		{"holds without a manager", "GET", "/api/v1/holds", "tok-bob", 503, "approval_unavailable", "holds are not available"},
		{"grants without a manager", "GET", "/api/v1/grants", "tok-bob", 503, "approval_unavailable", "holds are not available"},
		{"receipt without a manager", "GET", "/api/v1/holds/h1/receipt", "tok-bob", 503, "approval_unavailable", "holds are not available"},
		{"audit tail without a manager", "GET", "/api/v1/audit?limit=0", "tok-bob", 503, "approval_unavailable", "holds are not available"}, // people's routes share withPerson
		{"ca.pem without interception", "GET", "/ca.pem", "", 404, "not_found", "TLS interception is not configured"},
		{"receipts key without a signer", "GET", "/api/v1/receipts/key", "", 404, "not_found", "receipts are disabled"},
		{"sandbox event from an approver", "POST", "/api/v1/sandbox-events", "tok-bob", 401, "unauthenticated", "session token"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(`{}`))
			if tc.token != "" {
				req.Header.Set("Authorization", "Bearer "+tc.token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var body struct {
				Error struct{ Code, Message string } `json:"error"`
			}
			raw, _ := io.ReadAll(resp.Body)
			_ = json.Unmarshal(raw, &body)
			if resp.StatusCode != tc.status || body.Error.Code != tc.code || !strings.Contains(body.Error.Message, tc.says) {
				t.Fatalf("%d %s, want %d %s saying %q", resp.StatusCode, raw, tc.status, tc.code, tc.says)
			}
		})
	}
	resp, err := http.Get(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var ready struct {
		Ready    bool
		Problems []string
	}
	if err := json.NewDecoder(resp.Body).Decode(&ready); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 503 || ready.Ready || len(ready.Problems) != 2 ||
		!strings.HasPrefix(ready.Problems[0], "policy: not loaded") || ready.Problems[1] != "policy: last reload failed: rego: 1 error occurred" {
		t.Fatalf("/readyz %d %+v: want 503 naming the missing policy and the failed reload", resp.StatusCode, ready)
	}
	if len(audited) != 0 {
		t.Fatalf("refused requests were audited: %+v", audited)
	}
}
