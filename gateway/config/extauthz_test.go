package config

import (
	"strings"
	"testing"
)

func TestExtAuthzGood(t *testing.T) {
	for _, tc := range []struct{ name, yaml, listen string }{
		{"unix", `{listen: "unix:run/authz.sock", trusted_uids: [101]}`, "unix:/etc/sluice/run/authz.sock"},
		{"absolute path", `{listen: /run/sluice/authz.sock, trusted_uids: [101]}`, "unix:/run/sluice/authz.sock"},
		{"tcp mtls", `{listen: "0.0.0.0:9191", cert_file: tls/gw.pem, key_file: tls/gw.key, client_ca_file: tls/ca.pem}`, "0.0.0.0:9191"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Replace(good, "  admin_listen: 127.0.0.1:0\n", "  admin_listen: 127.0.0.1:0\n  ext_authz: "+tc.yaml+"\n", 1)
			c, err := Parse([]byte(src), "/etc/sluice")
			if err != nil {
				t.Fatal(err)
			}
			e := c.Gateway.ExtAuthz
			if e.Listen != tc.listen {
				t.Errorf("listen = %q, want %q", e.Listen, tc.listen)
			}
			if e.HoldWait.Std() != DefaultExtAuthzHoldWait {
				t.Errorf("hold_wait default = %v", e.HoldWait)
			}
			if tc.name == "tcp mtls" && e.ClientCAFile != "/etc/sluice/tls/ca.pem" {
				t.Errorf("client_ca_file = %q, want it resolved", e.ClientCAFile)
			}
		})
	}
}

// TestExtAuthzBadValuesNameTheirKey: every refusal names the key at fault.
func TestExtAuthzBadValuesNameTheirKey(t *testing.T) {
	for _, tc := range []struct{ name, yaml, want string }{
		{"no listen", `{trusted_uids: [1]}`, "gateway.ext_authz.listen: must be set"},
		{"unix without uids", `{listen: "unix:/run/a.sock"}`, "gateway.ext_authz.trusted_uids: must list"},
		{"relative unix after resolve is absolute; empty is not", `{listen: "unix:", trusted_uids: [1]}`, "gateway.ext_authz.listen: want unix:/absolute/path"},
		{"unix with tls keys", `{listen: "unix:/run/a.sock", trusted_uids: [1], cert_file: a}`, "gateway.ext_authz.cert_file: is for a TCP listener"},
		{"tcp without mtls", `{listen: "127.0.0.1:9191", cert_file: a, key_file: b}`, "gateway.ext_authz.client_ca_file: must be set: a TCP listener requires mutual TLS"},
		{"tcp with uids", `{listen: "127.0.0.1:9191", cert_file: a, key_file: b, client_ca_file: c, trusted_uids: [1]}`, "gateway.ext_authz.trusted_uids: is for a Unix socket"},
		{"tcp bad port", `{listen: "127.0.0.1:99999", cert_file: a, key_file: b, client_ca_file: c}`, "gateway.ext_authz.listen: bad port"},
		{"tcp no host", `{listen: ":9191", cert_file: a, key_file: b, client_ca_file: c}`, "gateway.ext_authz.listen: host must be set"},
		{"principal not spiffe", `{listen: "unix:/a", trusted_uids: [1], principals: [{principal: "cluster.local/ns/a", agent: support-bot}]}`, "gateway.ext_authz.principals[0].principal: want a SPIFFE ID"},
		{"principal twice", `{listen: "unix:/a", trusted_uids: [1], principals: [{principal: "spiffe://td/a", agent: support-bot}, {principal: "spiffe://td/a", agent: support-bot}]}`, "gateway.ext_authz.principals[1].principal: \"spiffe://td/a\" is listed twice"},
		{"principal unknown agent", `{listen: "unix:/a", trusted_uids: [1], principals: [{principal: "spiffe://td/a", agent: nobody}]}`, "gateway.ext_authz.principals[0].agent: \"nobody\" is not in agents[]"},
		{"principal no agent", `{listen: "unix:/a", trusted_uids: [1], principals: [{principal: "spiffe://td/a"}]}`, "gateway.ext_authz.principals[0].agent: must be set"},
		{"negative hold wait", `{listen: "unix:/a", trusted_uids: [1], hold_wait: -1s}`, "gateway.ext_authz.hold_wait: must not be negative"},
		{"xds no listeners", `{listen: "unix:/a", trusted_uids: [1], xds: {}}`, "gateway.ext_authz.xds.listeners: must list"},
		{"xds listener no sandbox", `{listen: "unix:/a", trusted_uids: [1], xds: {listeners: [{name: a, address: "127.0.0.1:10000", agent: support-bot}]}}`, "gateway.ext_authz.xds.listeners[0].sandbox: must be set"},
		{"xds listener bad address", `{listen: "unix:/a", trusted_uids: [1], xds: {listeners: [{name: a, address: "nope", sandbox: s, agent: support-bot}]}}`, "gateway.ext_authz.xds.listeners[0].address: want host:port"},
		{"xds listener twice", `{listen: "unix:/a", trusted_uids: [1], xds: {listeners: [{name: a, address: "127.0.0.1:1", sandbox: s, agent: support-bot}, {name: a, address: "127.0.0.1:2", sandbox: t, agent: support-bot}]}}`, "gateway.ext_authz.xds.listeners[1].name: \"a\" is used twice"},
		{"xds tcp needs envoy's client cert", `{listen: "127.0.0.1:9191", cert_file: a, key_file: b, client_ca_file: c, xds: {listeners: [{name: a, address: "127.0.0.1:1", sandbox: s, agent: support-bot}]}}`, "gateway.ext_authz.xds.client_cert_file: must be set"},
		{"unknown key", `{listen: "unix:/a", trusted_uids: [1], failure_mode_allow: true}`, "gateway.ext_authz.failure_mode_allow"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := strings.Replace(good, "  admin_listen: 127.0.0.1:0\n", "  admin_listen: 127.0.0.1:0\n  ext_authz: "+tc.yaml+"\n", 1)
			_, err := Parse([]byte(src), "/etc/sluice")
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
}
