package creds

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/vault"
)

// TestCheckSecretRefs: `sluice validate` names every secret the
// configuration refers to — a connector's credential or an egress
// placeholder's — that the local store lacks.
// refsYAML names two secrets: a connector's credential and an egress
// placeholder's; %s are the state dir, the relay's uid and the spec.
const refsYAML = `
gateway:
  sandbox_socket: %[1]s/relay.sock
  trusted_relay_uids: [%[2]d]
  admin_listen: 127.0.0.1:0
store: sqlite:%[1]s/sluice.db
audit: { path: %[1]s/audit.log }
secrets: { backend: local, local: { path: %[1]s/secrets.json, key_file: %[1]s/secrets.key } }
connectors:
  - slug: tickets
    spec: %[3]s
    base_url: http://127.0.0.1:1
    allow_private: [127.0.0.0/8]
    credential: { secret: tickets-key }
agents:
  - { name: agent-a, connectors: [tickets] }
policies:
  - { match: "*", action: block }
egress:
  intercept: { hosts: [api.test], ca_dir: %[1]s/ca }
  placeholders:
    - { secret: gh-token, hosts: [api.test], header: Authorization, prefix: "Bearer " }
`

func TestCheckSecretRefs(t *testing.T) {
	spec, _ := filepath.Abs("../testdata/tickets.yaml")
	parse := func(t *testing.T, dir string) *config.Config {
		t.Helper()
		data := fmt.Sprintf(refsYAML, dir, os.Getuid(), spec)
		cfg, err := config.Parse([]byte(data), dir)
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	set := func(t *testing.T, cfg *config.Config, names ...string) {
		t.Helper()
		st, err := vault.OpenLocal(cfg.Secrets.Local.Path, cfg.Secrets.Local.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range names {
			if err := st.Set(context.Background(), n, "project", vault.NewSecret([]byte("value-of-"+n))); err != nil {
				t.Fatal(err)
			}
		}
	}
	cases := []struct {
		name   string
		stored []string // nil: no store at all
		want   []string // one error each, in order
	}{
		{"no store yet", nil, []string{
			`connectors[0].credential.secret: "tickets-key" cannot exist yet`,
			`egress.placeholders[0].secret: "gh-token" cannot exist yet`}},
		{"placeholder's secret missing", []string{"tickets-key"}, []string{
			`egress.placeholders[0].secret: no secret named "gh-token"`}},
		{"connector's secret missing", []string{"gh-token"}, []string{
			`connectors[0].credential.secret: no secret named "tickets-key"`}},
		{"both stored", []string{"tickets-key", "gh-token"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := parse(t, t.TempDir())
			if tc.stored != nil {
				set(t, cfg, tc.stored...)
			}
			errs := CheckRefs(context.Background(), cfg)
			if len(errs) != len(tc.want) {
				t.Fatalf("errors %v, want %d", errs, len(tc.want))
			}
			for i, w := range tc.want {
				if !strings.Contains(errs[i].Error(), w) {
					t.Errorf("error %d = %v, want %q", i, errs[i], w)
				}
			}
			for _, err := range errs {
				if strings.Contains(err.Error(), "value-of-") {
					t.Errorf("an error carries a secret value: %v", err)
				}
			}
		})
	}
}
