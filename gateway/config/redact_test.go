package config

import (
	"net/netip"
	"strings"
	"testing"
)

// TestParseAllowPrivate: a bare address is that address alone (/32, /128);
// a CIDR has its host bits cleared; anything else is an error that shows
// the entry.
func TestParseAllowPrivate(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"10.0.0.5", "10.0.0.5/32"},
		{"fd00::5", "fd00::5/128"},
		{"10.0.0.0/8", "10.0.0.0/8"},
		{"10.0.0.5/8", "10.0.0.0/8"},
		{"127.0.0.1/32", "127.0.0.1/32"},
	} {
		p, err := ParseAllowPrivate(tc.in)
		if err != nil || p != netip.MustParsePrefix(tc.want) {
			t.Errorf("ParseAllowPrivate(%q) = %v, %v; want %s", tc.in, p, err, tc.want)
		}
	}
	for _, in := range []string{"", "10.0.0", "host.example", "fe80::1%eth0", "10.0.0.0/33"} {
		if p, err := ParseAllowPrivate(in); err == nil {
			t.Errorf("ParseAllowPrivate(%q) = %v, want an error", in, p)
		}
	}
	// Through the config: allow_private: [10.0.0.5] validates.
	cfg := strings.Replace(good, "allow_private: [10.0.0.0/8]", "allow_private: [10.0.0.5]", 1)
	if _, err := Parse([]byte(cfg), "/etc/sluice"); err != nil {
		t.Errorf("allow_private: [10.0.0.5]: %v", err)
	}
}

// TestRedactURL: user info and query are never shown; text that is not a
// URL is not shown at all.
func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"https://alice:s3cret@vault.example:8200/x?token=s3cret#f", "https://REDACTED@vault.example:8200/x?REDACTED"},
		{"https://s3cret@host/", "https://REDACTED@host/"},
		{"https://host/spec.yaml", "https://host/spec.yaml"},
		{"postgres://u:s3cret@db/sluice?sslmode=disable", "postgres://REDACTED@db/sluice?REDACTED"},
		{"postgres:u:s3cret@db", "postgres:REDACTED"},
		{"sqlite:/var/lib/x.db", "sqlite:/var/lib/x.db"},
		{"https://u:s3cret@ho st/%zz", "(not shown: not a URL)"},
	} {
		if got := RedactURL(tc.in); got != tc.want || strings.Contains(got, "s3cret") {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
