package egress

import (
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/mitm"
	"github.com/sluice-gw/sluice/policy"
)

// testInterceptor binds secret "gh" to api.example.com and *.gh.example
// in Authorization with prefix "Bearer ".
func testInterceptor(t testing.TB) *Interceptor {
	t.Helper()
	cfg := config.Defaults()
	cfg.Egress.Intercept = config.Intercept{Hosts: []string{"api.example.com"}, CADir: t.TempDir()}
	cfg.Egress.Placeholders = []config.Placeholder{{Secret: "gh", Hosts: []string{"api.example.com", "*.gh.example"}, Header: "Authorization", Prefix: "Bearer "}}
	in, err := NewInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestHostListed(t *testing.T) {
	list := []string{"api.github.com", "*.example.com"}
	for _, tc := range []struct {
		host string
		want bool
	}{
		{"api.github.com", true},
		{"github.com", false},
		{"x.api.github.com", false},
		{"a.example.com", true},
		{"a.b.example.com", true},
		{"example.com", false}, // "*.domain" is below domain only, as in agents[].egress
		{"badexample.com", false},
	} {
		t.Run(tc.host, func(t *testing.T) {
			if got := hostListed(list, tc.host); got != tc.want {
				t.Fatalf("hostListed(%q) = %v", tc.host, got)
			}
		})
	}
}

func TestPlaceholderStable(t *testing.T) {
	dir := t.TempDir()
	k, err := mitm.LoadOrCreateHMACKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b, c := placeholderFor(k, "gh"), placeholderFor(k, "gh"), placeholderFor(k, "npm")
	if a != b || a == c || !strings.HasPrefix(a, "sluice:secret:gh:") || len(a) != len("sluice:secret:gh:")+32 {
		t.Fatalf("placeholders %q %q %q", a, b, c)
	}
	other := make([]byte, 32)
	if placeholderFor(other, "gh") == a {
		t.Fatal("the placeholder does not depend on the deployment key")
	}
}

func TestPlanFor(t *testing.T) {
	in := testInterceptor(t)
	ph := in.phs[0].token
	for _, tc := range []struct {
		name   string
		host   string
		hdr    http.Header
		target string
		subst  bool
		events []string
		err    error
	}{
		{"bound host, declared header", "api.example.com", http.Header{"Authorization": {"Bearer " + ph}}, "/user", true, nil, nil},
		{"bound by glob", "x.gh.example", http.Header{"Authorization": {"Bearer " + ph}}, "/", true, nil, nil},
		{"other host", "evil.example", http.Header{"Authorization": {"Bearer " + ph}}, "/", false, []string{evHostMismatch}, nil},
		{"other header", "api.example.com", http.Header{"X-Token": {ph}}, "/", false, []string{evNotSubstituted}, nil},
		{"wrong prefix", "api.example.com", http.Header{"Authorization": {"token " + ph}}, "/", false, []string{evNotSubstituted}, nil},
		{"declared header twice", "api.example.com", http.Header{"Authorization": {"Bearer " + ph, "Bearer " + ph}}, "/", false, []string{evNotSubstituted, evNotSubstituted}, nil},
		{"in the query", "api.example.com", nil, "/q?t=" + ph, false, []string{evNotSubstituted}, nil},
		{"in the path, escaped", "evil.example", nil, "/" + strings.ReplaceAll(ph, ":", "%3A"), false, []string{evHostMismatch}, nil},
		{"D6 CR/LF next to it in the URL", "api.example.com", nil, "/q?t=" + ph + "%0d%0aX-Evil:%201", false, nil, errPlaceholderCRLF},
		{"no placeholder", "api.example.com", http.Header{"Authorization": {"Bearer abc"}}, "/", false, nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := in.planFor(tc.host, tc.hdr, tc.target)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if (p.subst != nil) != tc.subst {
				t.Fatalf("substituted = %v, want %v", p.subst != nil, tc.subst)
			}
			if strings.Join(p.events, ",") != strings.Join(tc.events, ",") {
				t.Fatalf("events = %v, want %v", p.events, tc.events)
			}
		})
	}
}

func TestTokenDetector(t *testing.T) {
	in := testInterceptor(t)
	ph := in.phs[0].token
	for _, tc := range []struct {
		name, host, body string
		want             string
	}{
		{"split across reads, bound host", "api.example.com", `{"t":"` + ph + `"}`, evNotSubstituted},
		{"other host", "evil.example", "x" + ph, evHostMismatch},
		{"absent", "evil.example", strings.Repeat("sluice:secret:gh:", 100), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			done := 0
			d := newTokenDetector(io.NopCloser(iotest.OneByteReader(strings.NewReader(tc.body))), in, func() { done++ })
			b, err := io.ReadAll(d)
			if err != nil || string(b) != tc.body {
				t.Fatalf("body changed: %v", err)
			}
			_ = d.Close()
			if done != 1 {
				t.Fatalf("done called %d times", done)
			}
			if got := strings.Join(d.events(in, tc.host), ","); got != tc.want {
				t.Fatalf("events %q, want %q", got, tc.want)
			}
		})
	}
}

func TestIntercepts(t *testing.T) {
	in := testInterceptor(t)
	var none *Interceptor
	for _, tc := range []struct {
		name string
		in   *Interceptor
		host string
		d    policy.Decision
		want bool
	}{
		{"configured host", in, "api.example.com", policy.Decision{}, true},
		{"other host", in, "pypi.org", policy.Decision{}, false},
		{"obligation", in, "pypi.org", policy.Decision{Obligations: map[string]any{"intercept": true}}, true},
		{"obligation false", in, "pypi.org", policy.Decision{Obligations: map[string]any{"intercept": false}}, false},
		{"not configured", none, "api.example.com", policy.Decision{Obligations: map[string]any{"intercept": true}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.in.intercepts(tc.host, tc.d); got != tc.want {
				t.Fatalf("intercepts = %v", got)
			}
		})
	}
}

func TestNewInterceptor(t *testing.T) {
	t.Run("nothing configured", func(t *testing.T) {
		in, err := NewInterceptor(config.Defaults())
		if in != nil || err != nil {
			t.Fatalf("got %v %v", in, err)
		}
	})
	t.Run("a CA key readable by others refuses to start", func(t *testing.T) {
		dir := t.TempDir()
		cfg := config.Defaults()
		cfg.Egress.Intercept = config.Intercept{Hosts: []string{"a.example"}, CADir: dir}
		if _, err := NewInterceptor(cfg); err != nil {
			t.Fatal(err)
		}
		_ = os.Chmod(filepath.Join(dir, mitm.KeyFile), 0o644)
		var pe *mitm.PermissionError
		if _, err := NewInterceptor(cfg); !errors.As(err, &pe) {
			t.Fatalf("got %v, want *mitm.PermissionError", err)
		}
	})
	t.Run("upstream_ca_file without a certificate", func(t *testing.T) {
		dir := t.TempDir()
		f := filepath.Join(t.TempDir(), "upstream.pem")
		_ = os.WriteFile(f, []byte("nope"), 0o600)
		cfg := config.Defaults()
		cfg.Egress.Intercept = config.Intercept{Hosts: []string{"a.example"}, CADir: dir, UpstreamCAFile: f}
		if _, err := NewInterceptor(cfg); err == nil || !strings.Contains(err.Error(), "upstream_ca_file") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestInterceptConfig(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, wantErr string
	}{
		{"valid", "egress:\n  intercept:\n    hosts: [api.github.com, \"*.example.com\"]\n  placeholders:\n    - {secret: gh, hosts: [api.github.com], header: Authorization, prefix: \"Bearer \"}\n", ""},
		{"bad host", "egress:\n  intercept:\n    hosts: [\"API.github.com:443\"]\n", "egress.intercept.hosts[0]"},
		{"placeholder without hosts", "egress:\n  placeholders:\n    - {secret: gh, header: Authorization}\n", "egress.placeholders[0].hosts"},
		{"bad header", "egress:\n  placeholders:\n    - {secret: gh, hosts: [a.example], header: \"Auth orization\"}\n", "egress.placeholders[0].header"},
		{"D6 CR/LF in prefix", "egress:\n  placeholders:\n    - {secret: gh, hosts: [a.example], header: Authorization, prefix: \"Bearer\\r\\nX: \"}\n", "egress.placeholders[0].prefix"},
		{"secret bound twice", "egress:\n  placeholders:\n    - {secret: gh, hosts: [a.example], header: A}\n    - {secret: gh, hosts: [b.example], header: B}\n", "egress.placeholders[1].secret"},
		{"unknown key", "egress:\n  intercept:\n    host: [a.example]\n", "host"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := config.Parse([]byte(tc.yaml), t.TempDir())
			if tc.wantErr == "" {
				if err != nil {
					t.Fatal(err)
				}
				if c.Egress.Intercept.CADir != "/var/lib/sluice/ca" {
					t.Fatalf("ca_dir default %q", c.Egress.Intercept.CADir)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error naming %s", err, tc.wantErr)
			}
		})
	}
}

// FuzzPlanFor: whatever the request, a placeholder is substituted only in
// the declared header toward a bound host, and never with CR/LF around.
func FuzzPlanFor(f *testing.F) {
	in := testInterceptor(f)
	ph := in.phs[0].token
	f.Add("api.example.com", "Authorization", "Bearer "+ph, "/")        // the one substituted form
	f.Add("evil.example", "Authorization", "Bearer "+ph, "/")           // unbound host
	f.Add("api.example.com", "X-Other", ph, "/?q="+ph)                  // other header and query
	f.Add("api.example.com", "Authorization", "Bearer "+ph+"\r\n", "/") // D6 CR/LF in the header
	f.Add("x.gh.example", "authorization", "Bearer "+ph, "/%0a"+ph)     // glob host, LF in the URL
	f.Fuzz(func(t *testing.T, host, name, value, target string) {
		hdr := http.Header{http.CanonicalHeaderKey(name): {value}}
		p, err := in.planFor(host, hdr, target)
		if err != nil {
			return
		}
		if p.subst != nil {
			if !hostListed(p.subst.cfg.Hosts, host) || http.CanonicalHeaderKey(name) != "Authorization" || value != "Bearer "+ph {
				t.Fatalf("substituted toward %q in %q = %q", host, name, value)
			}
			if strings.ContainsAny(value, "\r\n") {
				t.Fatal("substituted next to CR/LF")
			}
		}
	})
}

// TestPlanForConnection (THREATS D19): a placeholder bound to an OAuth
// connection is substituted only in its header toward its hosts; in the
// header or target of a request to any other host the request is
// refused (errConnectionElsewhere), not sent on with the placeholder as
// a secret's is. Its name is the token's, oauth2.SLUG.
func TestPlanForConnection(t *testing.T) {
	cfg := config.Defaults()
	cfg.Egress.Intercept = config.Intercept{Hosts: []string{"api.example.com"}, CADir: t.TempDir()}
	cfg.Egress.Placeholders = []config.Placeholder{{Connection: "docs", Hosts: []string{"api.example.com"}, Header: "Authorization", Prefix: "Bearer "}}
	in, err := NewInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ph := in.phs[0].token
	if !strings.HasPrefix(ph, PlaceholderPrefix+"oauth2.docs:") || in.phs[0].cfg.Secret != "oauth2.docs" {
		t.Fatalf("placeholder %q for secret %q", ph, in.phs[0].cfg.Secret)
	}
	for _, tc := range []struct {
		name   string
		host   string
		hdr    http.Header
		target string
		subst  bool
		err    error
	}{
		{"bound host, declared header", "api.example.com", http.Header{"Authorization": {"Bearer " + ph}}, "/user", true, nil},
		{"bound host, other header: sent unchanged", "api.example.com", http.Header{"X-Token": {ph}}, "/", false, nil},
		{"other host, declared header", "evil.example", http.Header{"Authorization": {"Bearer " + ph}}, "/", false, errConnectionElsewhere},
		{"other host, another header", "evil.example", http.Header{"X-Token": {ph}}, "/", false, errConnectionElsewhere},
		{"other host, in the query", "evil.example", nil, "/q?t=" + ph, false, errConnectionElsewhere},
		{"other host, in the path, escaped", "evil.example", nil, "/" + strings.ReplaceAll(ph, ":", "%3A"), false, errConnectionElsewhere},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := in.planFor(tc.host, tc.hdr, tc.target)
			if !errors.Is(err, tc.err) {
				t.Fatalf("err = %v, want %v", err, tc.err)
			}
			if (p.subst != nil) != tc.subst {
				t.Fatalf("substituted = %v, want %v", p.subst != nil, tc.subst)
			}
		})
	}
}
