package checks

import (
	"errors"
	"net/netip"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
)

// TestUpstreamProblems: a base URL the guard will refuse at every call is
// an error naming the key and the allow_private entry that would admit it;
// an allow_private wider than the base URL needs is a warning naming the
// narrower prefix. Classes as in gateway/guard (RFC 1918, RFC 4193, RFC 6598).
func TestUpstreamProblems(t *testing.T) {
	cases := []struct {
		name, baseURL string
		fromSpec      bool
		allow         []string
		errs, warns   []string
	}{
		{"loopback without allow_private", "http://127.0.0.1:8080", false, nil,
			[]string{"connectors[0].base_url: 127.0.0.1 is a loopback address and no connectors[0].allow_private entry covers it: the guard refuses every call; add 127.0.0.1/32 to allow_private"}, nil},
		{"RFC 1918 outside allow_private", "http://10.1.2.3", false, []string{"192.168.0.0/16"},
			[]string{"10.1.2.3 is a private address and no connectors[0].allow_private entry covers it"},
			[]string{"connectors[0].allow_private[0]: 192.168.0.0/16 does not cover the base URL's address 10.1.2.3"}},
		{"wider than needed", "https://10.1.2.3", false, []string{"10.0.0.0/8"}, nil,
			[]string{"connectors[0].allow_private[0]: 10.0.0.0/8 admits 16777216 addresses where the base URL needs only 10.1.2.3: narrow it to 10.1.2.3/32"}},
		{"exactly the host", "https://10.1.2.3", false, []string{"10.1.2.3/32"}, nil, nil},
		{"a bare address is the host alone (/32)", "https://10.1.2.3", false, []string{"10.1.2.3"}, nil, nil},
		{"a bare address elsewhere admits nothing", "https://10.1.2.3", false, []string{"10.1.2.4"},
			[]string{"10.1.2.3 is a private address and no connectors[0].allow_private entry covers it"},
			[]string{"connectors[0].allow_private[0]: 10.1.2.4 does not cover the base URL's address 10.1.2.3"}},
		{"ULA wider than needed", "https://[fd12:3456::1]", false, []string{"fd12:3456::/64"}, nil,
			[]string{"fd12:3456::/64 admits 18446744073709551616 addresses where the base URL needs only fd12:3456::1: narrow it to fd12:3456::1/128"}},
		{"public: allow_private not needed", "https://93.184.215.14", false, []string{"10.0.0.0/8"}, nil,
			[]string{"connectors[0].allow_private[0]: 10.0.0.0/8 is not needed: the base URL's address 93.184.215.14 is public"}},
		{"metadata address, whatever allow_private says", "http://169.254.169.254", false, nil,
			[]string{"connectors[0].base_url: 169.254.169.254 is a metadata address: the guard refuses every call to it"}, nil},
		{"CGNAT from the spec's servers", "http://100.64.0.1", true, nil,
			[]string{"connectors[0].spec (its servers' first url): 100.64.0.1 is a cgnat address"}, nil},
		{"localhost without allow_private", "http://localhost:9000", false, nil,
			[]string{"connectors[0].base_url: localhost is a loopback name and the connector has no allow_private"}, nil},
		{"a name is checked per call", "https://api.internal.example", false, []string{"10.0.0.0/8"}, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, _ := url.Parse(tc.baseURL)
			cc := config.Connector{Slug: "api", AllowPrivate: tc.allow}
			if !tc.fromSpec {
				cc.BaseURL = tc.baseURL
			}
			var allow []netip.Prefix
			for _, p := range tc.allow {
				pfx, err := config.ParseAllowPrivate(p)
				if err != nil {
					t.Fatal(err)
				}
				allow = append(allow, pfx)
			}
			cfg := &config.Config{Connectors: []config.Connector{cc}}
			var f Findings
			f.Add(Upstreams(cfg, func(slug string) (*url.URL, []netip.Prefix) {
				if slug != "api" {
					t.Fatalf("asked for connector %q", slug)
				}
				return u, allow
			}))
			expectFindings(t, f, tc.errs, tc.warns)
		})
	}
}

// expectFindings checks that f holds exactly one finding per wanted text,
// of the wanted kind.
func expectFindings(t *testing.T, f Findings, errs, warns []string) {
	t.Helper()
	for _, c := range []struct {
		kind      string
		got       []error
		want      []string
		isWarning bool
	}{{"errors", f.Errors, errs, false}, {"warnings", f.Warnings, warns, true}} {
		if len(c.got) != len(c.want) {
			t.Errorf("%s = %q, want %d: %q", c.kind, c.got, len(c.want), c.want)
			continue
		}
		for i, w := range c.want {
			var wr *Warning
			if !strings.Contains(c.got[i].Error(), w) || errors.As(c.got[i], &wr) != c.isWarning {
				t.Errorf("%s[%d] = %q, want it to say %q", c.kind, i, c.got[i], w)
			}
		}
	}
}

// TestAskProblems: an ask rule nobody can approve — no approver accounts,
// an approver group with no member who can log in, a name not configured,
// no approver at all — is an error naming the rule (its calls would all be
// refused 503 approval_unavailable); with OIDC, names and groups come from
// the provider and are not judged.
func TestAskProblems(t *testing.T) {
	const tok = "abababababababababababababababababababababababababababababababab"
	finance := []config.User{{Name: "carol", Groups: []string{"finance"}, TokenSHA256: tok}, {Name: "dan", Groups: []string{"ops"}}}
	cases := []struct {
		name      string
		approvers []string
		users     []config.User
		oidc      bool
		rego      []string
		errs      []string
		warns     []string
	}{
		{"a member who can log in", []string{"group:finance"}, finance, false, nil, nil, nil},
		{"a named user who can log in", []string{"carol"}, finance, false, nil, nil, nil},
		{"one of several approvers suffices", []string{"group:legal", "carol"}, finance, false, nil, nil, nil},
		{"no approver accounts at all", []string{"group:finance"}, nil, false, nil,
			[]string{"policies[0]: nobody can approve this ask rule: approvers.users is empty and approvers.oidc is not set"}, nil},
		{"group with no member", []string{"group:legal"}, finance, false, nil,
			[]string{"policies[0].approvers: nobody can approve this ask rule: group:legal has no member in approvers.users"}, nil},
		{"members who cannot log in", []string{"group:ops", "dan"}, finance, false, nil,
			[]string{"no member of group:ops has a password_hash or token_sha256 to log in with; dan has no password_hash or token_sha256"}, nil},
		{"unknown user", []string{"bob"}, finance, false, nil, []string{"bob is not in approvers.users"}, nil},
		{"OIDC decides who is in a group", []string{"group:legal"}, nil, true, nil, nil, nil},
		{"no approver named", nil, finance, false, nil, []string{"policies[0].approvers: the ask rule names no approver"}, nil},
		{"no approver named, rego may add one", nil, finance, false, []string{"/etc/sluice/rego"}, nil, []string{"policies[0].approvers: the ask rule names no approver; its calls can be approved only if a rego module"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := &config.Config{
				Policies:  []config.Policy{{Match: "a.b", Action: "ask", Approvers: tc.approvers}, {Match: "*", Action: "block"}},
				Approvers: config.Approvers{Users: tc.users},
				Rego:      tc.rego,
			}
			if tc.oidc {
				cfg.Approvers.OIDC = &config.OIDC{Issuer: "https://idp.example"}
			}
			var f Findings
			f.Add(Asks(cfg))
			expectFindings(t, f, tc.errs, tc.warns)
		})
	}
}

// TestMetadataRangesCoverGuard: every address the guard classifies as
// metadata, in each IPv6 spelling it looks through, is inside
// config.MetadataRanges, so an allow_private reaching it needs
// allow_private_covers_metadata.
func TestMetadataRangesCoverGuard(t *testing.T) {
	for _, s := range []string{
		"169.254.169.254", "169.254.169.253", "169.254.170.2", "100.100.100.200", "168.63.129.16", "fd00:ec2::254",
		"::ffff:169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1", "64:ff9b::6464:64c8", "2002:a83f:8110::1",
	} {
		a := netip.MustParseAddr(s)
		if c := guard.Classify(a); c != guard.Metadata {
			t.Errorf("guard classifies %s as %s: this list is stale", s, c)
		}
		if _, ok := config.CoversMetadata(netip.PrefixFrom(a, a.BitLen())); !ok {
			t.Errorf("%s is metadata to the guard and outside config.MetadataRanges", s)
		}
	}
}
