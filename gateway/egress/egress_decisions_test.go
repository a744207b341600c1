package egress

import (
	"context"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
)

// TestEgressDecisions covers the cache itself: keyed by engine, version,
// caller, kind and request; policy errors are never cached; a block is
// returned as the block it was; entries expire.
func TestEgressDecisions(t *testing.T) {
	e1, e2 := policy.BlockAll("a"), policy.BlockAll("b")
	allow := policy.Decision{Action: policy.Allow, Rule: "egress"}
	block := policy.Decision{Action: policy.Block, Rule: "team.freeze", Reason: "frozen"}
	rk := requestKey(&policy.Request{Method: "GET", Host: "a.test", Port: 80, Path: "/"})
	k := egressDecisionKey{caller: policy.Caller{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice"}, kind: "http", req: rk}
	now := time.Now()
	with := func(f func(*egressDecisionKey)) egressDecisionKey { k2 := k; f(&k2); return k2 }
	tests := []struct {
		name string
		put  func(dc *egressDecisions)
		key  egressDecisionKey
		eng  *policy.Engine
		ver  int64
		at   time.Time
		want *policy.Decision // nil: a miss
	}{
		{"hit", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, k, e1, 1, now, &allow},
		{"a block stays a block", func(dc *egressDecisions) { dc.put(e1, 1, k, block, now) }, k, e1, 1, now, &block},
		{"another engine", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, k, e2, 1, now, nil},
		{"another version (a reload)", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, k, e1, 2, now, nil},
		{"another sandbox", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, with(func(k *egressDecisionKey) { k.caller.Sandbox = "sb-2" }), e1, 1, now, nil},
		{"another session", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, with(func(k *egressDecisionKey) { k.caller.Session = "s-2" }), e1, 1, now, nil},
		{"another user", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, with(func(k *egressDecisionKey) { k.caller.User = "bob" }), e1, 1, now, nil},
		{"another kind", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, with(func(k *egressDecisionKey) { k.kind = "connect" }), e1, 1, now, nil},
		{"another request", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, with(func(k *egressDecisionKey) { k.req[0] ^= 1 }), e1, 1, now, nil},
		{"policy error not cached", func(dc *egressDecisions) {
			dc.put(e1, 1, k, policy.Decision{Action: policy.Block, Rule: policy.RulePolicyError, Reason: "policy evaluation timed out"}, now)
		}, k, e1, 1, now, nil},
		{"no engine: not cached", func(dc *egressDecisions) { dc.put(nil, 0, k, allow, now) }, k, nil, 0, now, nil},
		{"expired", func(dc *egressDecisions) { dc.put(e1, 1, k, allow, now) }, k, e1, 1, now.Add(decisionTTL), nil},
		{"a decision from before a reload does not replace the reloaded cache", func(dc *egressDecisions) {
			dc.put(e1, 2, k, block, now)
			dc.put(e1, 1, k, allow, now)
		}, k, e1, 2, now, &block},
		{"a later version empties the cache", func(dc *egressDecisions) {
			dc.put(e1, 1, k, allow, now)
			dc.put(e1, 2, with(func(k *egressDecisionKey) { k.req[0] ^= 1 }), allow, now)
		}, k, e1, 1, now, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var dc egressDecisions
			tc.put(&dc)
			got, ok := dc.get(tc.eng, tc.ver, tc.key, tc.at)
			switch {
			case tc.want == nil && ok:
				t.Fatalf("hit %+v, want a miss", got)
			case tc.want != nil && !ok:
				t.Fatal("miss, want a hit")
			case tc.want != nil && (got.Action != tc.want.Action || got.Rule != tc.want.Rule || got.Reason != tc.want.Reason):
				t.Fatalf("got %+v, want %+v", got, *tc.want)
			}
		})
	}
}

// TestEgressDecisionsBounded: the cache never holds more than its bound.
func TestEgressDecisionsBounded(t *testing.T) {
	e1 := policy.BlockAll("a")
	allow := policy.Decision{Action: policy.Allow, Rule: "egress"}
	var dc egressDecisions
	now := time.Now()
	for i := range maxCachedDecisions + 10 {
		dc.put(e1, 1, egressDecisionKey{kind: "http", req: requestKey(&policy.Request{Host: "a.test", Port: i})}, allow, now)
		if len(dc.m) > maxCachedDecisions {
			t.Fatalf("after %d puts: %d entries", i+1, len(dc.m))
		}
	}
}

// TestRequestKey: the key is injective over what policy sees: two
// requests that differ in anything policy reads never share a key.
func TestRequestKey(t *testing.T) {
	base := func() policy.Request {
		return policy.Request{Method: "GET", Host: "a.test", Port: 80, Path: "/x",
			Query: map[string][]string{"q": {"1"}}, Headers: map[string][]string{"Accept": {"*/*"}, "User-Agent": {"t"}}}
	}
	tests := []struct {
		name string
		edit func(r *policy.Request)
		same bool
	}{
		{"identical", func(r *policy.Request) {}, true},
		{"headers built in another order", func(r *policy.Request) {
			r.Headers = map[string][]string{"User-Agent": {"t"}, "Accept": {"*/*"}}
		}, true},
		{"method", func(r *policy.Request) { r.Method = "POST" }, false},
		{"host", func(r *policy.Request) { r.Host = "b.test" }, false},
		{"port", func(r *policy.Request) { r.Port = 8080 }, false},
		{"path", func(r *policy.Request) { r.Path = "/y" }, false},
		{"host and path boundary moved", func(r *policy.Request) { r.Host, r.Path = "a.tes", "t/x" }, false},
		{"query value", func(r *policy.Request) { r.Query["q"] = []string{"2"} }, false},
		{"query repeated", func(r *policy.Request) { r.Query["q"] = []string{"1", "1"} }, false},
		{"query nil", func(r *policy.Request) { r.Query = nil }, false},
		{"query empty", func(r *policy.Request) { r.Query = map[string][]string{} }, false},
		{"header added", func(r *policy.Request) { r.Headers["X-Deny"] = []string{"1"} }, false},
		{"header value", func(r *policy.Request) { r.Headers["Accept"] = []string{"text/html"} }, false},
		{"header values split", func(r *policy.Request) { r.Headers["Accept"] = []string{"*/", "*"} }, false},
		{"header name/value boundary moved", func(r *policy.Request) {
			delete(r.Headers, "Accept")
			r.Headers["Accept*"] = []string{"/*"}
		}, false},
		{"header moved into the query", func(r *policy.Request) {
			delete(r.Headers, "Accept")
			r.Query["Accept"] = []string{"*/*"}
		}, false},
		{"a large header", func(r *policy.Request) { r.Headers["Cookie"] = []string{strings.Repeat("c", 64<<10)} }, false},
	}
	b := base()
	want := requestKey(&b)
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := base()
			tc.edit(&r)
			got := requestKey(&r)
			if (got == want) != tc.same {
				t.Fatalf("same key = %v, want %v", got == want, tc.same)
			}
		})
	}
}

// TestEgressDecisionCache drives the forward proxy with a policy that
// reads headers and the query: every request is decided on its own input
// (a cached allow never answers a request whose headers, query or caller
// differ), and a policy reload takes effect on the very next request,
// well within the cache's TTL, with the upstream never reached.
func TestEgressDecisionCache(t *testing.T) {
	dir := t.TempDir()
	mod := filepath.Join(dir, "team.rego")
	rule := func(host string) []byte {
		return []byte("package sluice.policies.team\n\nimport rego.v1\n\n" +
			`decisions contains {"action": "block", "reason": "frozen", "rule": "team.freeze"} if {` + "\n" +
			`	input.kind == "http"` + "\n" + `	input.request.host == "` + host + `"` + "\n}\n" +
			`decisions contains {"action": "block", "reason": "header", "rule": "team.header"} if {` + "\n" +
			`	input.request.headers["X-Deny"][_] == "1"` + "\n}\n" +
			`decisions contains {"action": "block", "reason": "query", "rule": "team.query"} if {` + "\n" +
			`	input.request.query.q[_] == "bad"` + "\n}\n")
	}
	if err := os.WriteFile(mod, rule("nothing.test"), 0o644); err != nil {
		t.Fatal(err)
	}
	be := startBenchEgress(t, "", func(c *config.Config) { c.Rego = []string{dir} })
	ca, cb := be.viaProxy(t), be.viaProxyAs(t, agentB)
	get := func(c *http.Client, url string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, errCode(body)
	}
	steps := []struct {
		name   string
		c      *http.Client
		url    string
		hdr    map[string]string
		status int
		code   string
	}{
		{"allowed, cached", ca, "http://pkg.example/x", nil, http.StatusOK, ""},
		{"allowed again from the cache", ca, "http://pkg.example/x", nil, http.StatusOK, ""},
		{"same request, another caller: its own decision", cb, "http://pkg.example/x", nil, http.StatusForbidden, string(refusal.EgressDenied)},
		{"same request with a header policy blocks", ca, "http://pkg.example/x", map[string]string{"X-Deny": "1"}, http.StatusForbidden, string(refusal.EgressDenied)},
		{"same path with a query policy blocks", ca, "http://pkg.example/x?q=bad", nil, http.StatusForbidden, string(refusal.EgressDenied)},
		{"the cached allow is still an allow", ca, "http://pkg.example/x", nil, http.StatusOK, ""},
	}
	for _, s := range steps {
		before := be.requests.Load()
		status, code := get(s.c, s.url, s.hdr)
		if status != s.status || code != s.code {
			t.Fatalf("%s: %d %q, want %d %q", s.name, status, code, s.status, s.code)
		}
		if reached := be.requests.Load() != before; reached != (s.status == http.StatusOK) {
			t.Fatalf("%s: upstream reached = %v", s.name, reached)
		}
	}
	if err := os.WriteFile(mod, rule("pkg.example"), 0o644); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := be.g.Reload(context.Background()); err != nil {
		t.Fatal(err)
	}
	before := be.requests.Load()
	status, code := get(ca, "http://pkg.example/x", nil)
	if time.Since(start) >= decisionTTL {
		t.Skip("too slow to tell the reload from the cache's TTL")
	}
	if status != http.StatusForbidden || code != string(refusal.EgressDenied) || be.requests.Load() != before {
		t.Fatalf("after the reload: %d %q, upstream reached %d times; want 403 %s and none", status, code, be.requests.Load()-before, refusal.EgressDenied)
	}
	var decisions, refusals int
	for _, r := range auditEvents(t, be.g) {
		if r.Event == "decision" && r.Fields["dest_host"] == "pkg.example" {
			decisions++
			if r.Fields["decision"] == "block" {
				refusals++
			}
		}
	}
	// Every request has its decision record, cached or not: 7 requests, 4 refused.
	if decisions != 7 || refusals != 4 {
		t.Fatalf("audit: %d decision records (%d blocks), want 7 (4)", decisions, refusals)
	}
}
