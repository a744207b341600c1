package config

import (
	"strings"
	"testing"
	"time"
)

func withHosted(y string) string {
	return strings.Replace(good, "  admin_listen: 127.0.0.1:0\n", "  admin_listen: 127.0.0.1:0\n  hosted: "+y+"\n", 1)
}

func TestHostedGood(t *testing.T) {
	c, err := Parse([]byte(withHosted(`{listen: "0.0.0.0:3129", cert_file: tls/h.pem, key_file: tls/h.key}`)), "/etc/sluice")
	if err != nil {
		t.Fatal(err)
	}
	h := c.Gateway.Hosted
	if h.CertFile != "/etc/sluice/tls/h.pem" || h.KeyFile != "/etc/sluice/tls/h.key" {
		t.Errorf("files not resolved: %q %q", h.CertFile, h.KeyFile)
	}
	if h.MaxTokenTTL.Std() != DefaultMaxTokenTTL {
		t.Errorf("max_token_ttl default = %v", h.MaxTokenTTL)
	}
	if !strings.HasSuffix(h.TokenKeyFile, "/hosted-token.key") || !strings.HasPrefix(h.TokenKeyFile, "/") {
		t.Errorf("token_key_file default = %q, want hosted-token.key beside audit.path", h.TokenKeyFile)
	}
	c, err = Parse([]byte(withHosted(`{listen: "127.0.0.1:3129", cert_file: a, key_file: b, token_key_file: keys/t.key, max_token_ttl: 2h}`)), "/etc/sluice")
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.Hosted.TokenKeyFile != "/etc/sluice/keys/t.key" || c.Gateway.Hosted.MaxTokenTTL.Std() != 2*time.Hour {
		t.Errorf("got %+v", c.Gateway.Hosted)
	}
}

// TestHostedBadValuesNameTheirKey: every refusal names the key at fault.
func TestHostedBadValuesNameTheirKey(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"no listen", `{cert_file: a, key_file: b}`, "gateway.hosted.listen: want host:port"},
		{"no host", `{listen: ":3129", cert_file: a, key_file: b}`, "gateway.hosted.listen: host must be set"},
		{"bad port", `{listen: "0.0.0.0:99999", cert_file: a, key_file: b}`, "gateway.hosted.listen: bad port"},
		{"no certificate", `{listen: "0.0.0.0:3129", key_file: b}`, "gateway.hosted.cert_file: must be set"},
		{"no key", `{listen: "0.0.0.0:3129", cert_file: a}`, "gateway.hosted.key_file: must be set"},
		{"ttl too long", `{listen: "0.0.0.0:3129", cert_file: a, key_file: b, max_token_ttl: 721h}`, "gateway.hosted.max_token_ttl: must be between 1s and"},
		{"ttl below a second", `{listen: "0.0.0.0:3129", cert_file: a, key_file: b, max_token_ttl: 10ms}`, "gateway.hosted.max_token_ttl: must be between 1s and"},
		{"unknown key", `{listen: "0.0.0.0:3129", cert_file: a, key_file: b, client_ca_file: c}`, "gateway.hosted.client_ca_file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(withHosted(tc.yaml)), "/etc/sluice")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
