package policy

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/x509"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/open-policy-agent/opa/v1/bundle"
)

// freezeBundleModule blocks a tool named in the bundle's own data.
const freezeBundleModule = `package sluice.policies.frozen

decisions contains {"action": "block", "reason": "frozen by the bundle", "rule": "frozen.tools"} if {
	input.tool in data.frozen.tools
}
`

type bundleSpec struct {
	revision string
	roots    []string
	module   string         // the module's source ("" = freezeBundleModule)
	data     map[string]any // nil = {"frozen": {"tools": [tool]}}
	tool     string         // the frozen tool
	signKey  *rsa.PrivateKey
	tamper   bool // change a byte of the module after signing
}

// makeBundle writes a .tar.gz bundle as `opa build` (and `opa sign`) do,
// with OPA's own bundle writer and signer.
func makeBundle(t testing.TB, s bundleSpec) []byte {
	t.Helper()
	if s.module == "" {
		s.module = freezeBundleModule
	}
	if s.data == nil {
		s.data = map[string]any{"frozen": map[string]any{"tools": []any{s.tool}}}
	}
	roots := s.roots
	if roots == nil {
		roots = []string{"sluice/policies/frozen", "frozen"}
	}
	b := bundle.Bundle{
		Manifest: bundle.Manifest{Revision: s.revision, Roots: &roots},
		Data:     s.data,
		Modules:  []bundle.ModuleFile{{URL: "/frozen/frozen.rego", Path: "/frozen/frozen.rego", Raw: []byte(s.module)}},
	}
	if s.signKey != nil {
		der, err := x509.MarshalPKCS8PrivateKey(s.signKey)
		if err != nil {
			t.Fatal(err)
		}
		key := string(pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}))
		if err := b.GenerateSignature(bundle.NewSigningConfig(key, "RS256", ""), "default", false); err != nil {
			t.Fatalf("sign: %v", err)
		}
	}
	if s.tamper {
		raw := []byte(s.module)
		raw[bytes.Index(raw, []byte("frozen by"))] = 'F' // one byte of the signed module
		b.Modules[0].Raw = raw
	}
	var buf bytes.Buffer
	if err := bundle.NewWriter(&buf).DisableFormat(true).Write(b); err != nil {
		t.Fatalf("write bundle: %v", err)
	}
	return buf.Bytes()
}

func rsaKey(t testing.TB) (*rsa.PrivateKey, string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	der, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), "bundle.pub")
	if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	return k, p
}

func writeBundle(t testing.TB, path string, b []byte) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

var allowAll = []Rule{{Match: "*", Action: "allow"}}

func TestBundleFile(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "bundle.tar.gz")
	writeBundle(t, path, makeBundle(t, bundleSpec{revision: "r1", tool: "billing-api.get_invoice"}))
	var mu sync.Mutex
	var results []bool
	e := newEngine(t, Config{Rules: allowAll, Bundle: &BundleConfig{File: path},
		OnBundle: func(ok bool, _ error) { mu.Lock(); results = append(results, ok); mu.Unlock() }})

	d := e.Decide(ctx, toolCall("billing-api.get_invoice"))
	if d.Action != Block || d.Rule != "frozen.tools" || d.Revision != "r1" {
		t.Fatalf("decision = %+v, want block by frozen.tools at revision r1", d)
	}
	if d := e.Decide(ctx, toolCall("crm.list_contacts")); d.Action != Allow || d.Revision != "r1" {
		t.Fatalf("unfrozen tool: %+v", d)
	}

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = e.Watch(wctx) }()
	time.Sleep(100 * time.Millisecond)

	// A corrupt bundle: refused, counted, r1 keeps deciding.
	writeBundle(t, path, []byte("\x1f\x8b not really gzip"))
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(results) > 0 && !results[len(results)-1] })
	if d := e.Decide(ctx, toolCall("billing-api.get_invoice")); d.Action != Block || d.Revision != "r1" {
		t.Fatalf("after a corrupt bundle: %+v, want r1 still deciding", d)
	}

	// A bundle whose module does not compile: refused the same way.
	mu.Lock()
	results = nil
	mu.Unlock()
	writeBundle(t, path, makeBundle(t, bundleSpec{revision: "r-bad", tool: "x", module: "package sluice.policies.frozen\n\ndecisions contains x if {\n"}))
	waitFor(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(results) > 0 && !results[len(results)-1] })
	if e.Revision() != "r1" {
		t.Fatalf("revision = %q after a bundle that does not compile, want r1", e.Revision())
	}

	// The next good revision is picked up.
	writeBundle(t, path, makeBundle(t, bundleSpec{revision: "r2", tool: "crm.list_contacts"}))
	waitFor(t, func() bool { return e.Revision() == "r2" })
	if d := e.Decide(ctx, toolCall("crm.list_contacts")); d.Action != Block || d.Revision != "r2" {
		t.Fatalf("after r2: %+v, want crm.list_contacts frozen", d)
	}
	if d := e.Decide(ctx, toolCall("billing-api.get_invoice")); d.Action != Allow {
		t.Fatalf("after r2: get_invoice %+v, want allow", d)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 5s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// bundleServer is an HTTP bundle server on loopback that serves the
// current bundle with an ETag and answers If-None-Match with 304.
type bundleServer struct {
	mu       sync.Mutex
	body     []byte
	etag     string
	gets     atomic.Int64
	notMods  atomic.Int64
	received atomic.Int64 // requests carrying If-None-Match
}

func (s *bundleServer) set(b []byte, etag string) {
	s.mu.Lock()
	s.body, s.etag = b, etag
	s.mu.Unlock()
}

func (s *bundleServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.gets.Add(1)
	s.mu.Lock()
	body, etag := s.body, s.etag
	s.mu.Unlock()
	if inm := r.Header.Get("If-None-Match"); inm != "" {
		s.received.Add(1)
		if inm == etag {
			s.notMods.Add(1)
			w.WriteHeader(http.StatusNotModified)
			return
		}
	}
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Type", "application/gzip")
	_, _ = w.Write(body)
}

func TestBundleServer(t *testing.T) {
	ctx := context.Background()
	key, pub := rsaKey(t)
	other, _ := rsaKey(t)
	srv := &bundleServer{}
	srv.set(makeBundle(t, bundleSpec{revision: "r1", tool: "billing-api.get_invoice", signKey: key}), `"r1"`)
	hs := httptest.NewServer(srv)
	defer hs.Close()

	var mu sync.Mutex
	var fails []string
	e := newEngine(t, Config{Rules: allowAll, Bundle: &BundleConfig{URL: hs.URL + "/bundles/sluice.tar.gz", Poll: 20 * time.Millisecond,
		Verification: &Verification{KeyFile: pub}},
		OnBundle: func(ok bool, err error) {
			if !ok {
				mu.Lock()
				fails = append(fails, err.Error())
				mu.Unlock()
			}
		}})
	if d := e.Decide(ctx, toolCall("billing-api.get_invoice")); d.Action != Block || d.Revision != "r1" {
		t.Fatalf("decision = %+v, want block at r1", d)
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() { defer close(done); _ = e.PollBundle(pctx) }()

	// An unchanged bundle costs a 304.
	waitFor(t, func() bool { return srv.notMods.Load() >= 3 })
	if e.Version() != 1 {
		t.Fatalf("version = %d after 304s, want 1 (nothing recompiled)", e.Version())
	}

	nfails := func() int { mu.Lock(); defer mu.Unlock(); return len(fails) }
	for _, tc := range []struct {
		name, want string
		b          []byte
	}{
		{"unsigned", "missing .signatures.json", makeBundle(t, bundleSpec{revision: "r-unsigned", tool: "x"})},
		{"signed by another key", "verification", makeBundle(t, bundleSpec{revision: "r-other", tool: "x", signKey: other})},
		{"a byte changed after signing", "digest mismatch", makeBundle(t, bundleSpec{revision: "r-tampered", tool: "x", signKey: key, tamper: true})},
		{"outside its roots", "roots", makeBundle(t, bundleSpec{revision: "r-roots", tool: "x", signKey: key, roots: []string{"elsewhere"}})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := nfails()
			srv.set(tc.b, `"`+tc.name+`"`)
			waitFor(t, func() bool { return nfails() > before })
			mu.Lock()
			msg := fails[len(fails)-1]
			mu.Unlock()
			if !strings.Contains(strings.ToLower(msg), tc.want) {
				t.Errorf("failure = %q, want it to say %q", msg, tc.want)
			}
			if d := e.Decide(ctx, toolCall("billing-api.get_invoice")); d.Action != Block || d.Revision != "r1" {
				t.Fatalf("after a refused bundle: %+v, want r1 still deciding", d)
			}
			// Still served, it is asked for with its ETag: a 304, not an
			// error logged and counted at every poll.
			time.Sleep(10 * 20 * time.Millisecond)
			if n := nfails(); n != before+1 {
				t.Errorf("failures = %d after 10 more polls of the same bad bundle, want %d", n, before+1)
			}
		})
	}

	srv.set(makeBundle(t, bundleSpec{revision: "r2", tool: "crm.list_contacts", signKey: key}), `"r2"`)
	waitFor(t, func() bool { return e.Revision() == "r2" })
	if d := e.Decide(ctx, toolCall("crm.list_contacts")); d.Action != Block || d.Revision != "r2" {
		t.Fatalf("after r2: %+v", d)
	}
	if srv.received.Load() == 0 {
		t.Error("the poller never sent If-None-Match")
	}
	cancel()
	<-done
}

// TestBundleColdStart: a bundle that is refused at start leaves no engine
// (the gateway then blocks everything), never an engine without it.
func TestBundleColdStart(t *testing.T) {
	_, pub := rsaKey(t)
	path := filepath.Join(t.TempDir(), "b.tar.gz")
	writeBundle(t, path, makeBundle(t, bundleSpec{revision: "r1", tool: "x"}))
	if _, err := New(context.Background(), Config{Rules: allowAll, Bundle: &BundleConfig{File: path, Verification: &Verification{KeyFile: pub}}}); err == nil ||
		!strings.Contains(err.Error(), "missing .signatures.json") {
		t.Fatalf("New with an unsigned bundle and a key = %v, want refused", err)
	}
	if _, err := New(context.Background(), Config{Bundle: &BundleConfig{File: path, URL: "http://127.0.0.1:1/"}}); err == nil {
		t.Fatal("New with both file and url succeeded")
	}
	// Data under data.sluice is the library's, in a bundle as in a file.
	writeBundle(t, path, makeBundle(t, bundleSpec{revision: "r1", roots: []string{""}, data: map[string]any{"sluice": map[string]any{"config": map[string]any{}}}}))
	if _, err := New(context.Background(), Config{Bundle: &BundleConfig{File: path}}); err == nil || !strings.Contains(err.Error(), "data.sluice is reserved") {
		t.Fatalf("New with data.sluice in the bundle = %v, want refused", err)
	}
}
