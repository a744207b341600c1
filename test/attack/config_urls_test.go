//go:build linux

package attack

import (
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestConfigURLCredentialsNotEchoed is THREATS F11 through the real
// binary: a credential written into a URL of sluice.yaml — user info in
// connectors[].base_url, connectors[].spec, secrets.vault.address and
// store, a token in a spec URL's query — makes `sluice validate` fail with
// an error naming each key, and the credential appears nowhere in its
// output (an operator pastes validate's output into tickets and CI logs).
// The spec URL with a query is fetched only from 127.0.0.1 (port 1,
// where nothing listens), admitted by allow_private.
func TestConfigURLCredentialsNotEchoed(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	const secret = "s3cret-" + "4b1e9a"

	c := casebook.Expect(t, "F11", "user info with a password in connectors[0].base_url, connectors[1].spec, secrets.vault.address and store; sluice validate",
		"exit non-zero; one error naming each key, the URL shown as REDACTED@host; the password nowhere in the output")
	d := e.BaseConfig("urlcreds")
	conns := d["connectors"].([]map[string]any)
	conns[0]["base_url"] = "http://ops:" + secret + "@127.0.0.1:1/api"
	second := map[string]any{"slug": "spec-user", "spec": "https://ops:" + secret + "@specs.example/api.yaml"}
	d["connectors"] = append(conns, second)
	d["store"] = "mysql://sluice:" + secret + "@db.example/sluice"
	d["secrets"] = map[string]any{"backend": "vault", "vault": map[string]any{
		"address": "vault://root:" + secret + "@vault.example:8200",
		"auth":    map[string]any{"method": "token", "token_file": "/nonexistent"},
	}}
	out, err := e.CLI("", "validate", "--config", e.Write(d))
	keys := []string{"connectors[0].base_url", "connectors[1].spec", "secrets.vault.address", "store"}
	var missing []string
	for _, k := range keys {
		if !strings.Contains(out, "error: ") || !strings.Contains(out, k+": ") {
			missing = append(missing, k)
		}
	}
	leaked := strings.Contains(out, secret)
	redacted := strings.Count(out, "REDACTED@")
	c.Observef("exit %v; keys not named %v; %d URLs shown as REDACTED@; password shown %v", err, missing, redacted, leaked)
	if err == nil || len(missing) > 0 || leaked || redacted < len(keys) {
		t.Errorf("validate: %v\n%s", err, out)
	}

	q := casebook.Expect(t, "F11", "a token in the query of connectors[0].spec (https://127.0.0.1:1/spec.yaml?token=…, allow_private [127.0.0.1]); the fetch fails; sluice validate",
		"exit non-zero; the error names connectors[0].spec and the fetch, the URL without its query; the token nowhere in the output")
	d = e.BaseConfig("urlquery")
	conn := d["connectors"].([]map[string]any)[0]
	conn["spec"] = "https://127.0.0.1:1/spec.yaml?token=" + secret
	conn["allow_private"] = []string{"127.0.0.1"}
	out, err = e.CLI("", "validate", "--config", e.Write(d))
	named := strings.Contains(out, "connectors[0].spec: ") && strings.Contains(out, "fetch https://127.0.0.1:1/spec.yaml (user info and query not shown)")
	leaked = strings.Contains(out, secret)
	q.Observef("exit %v; key and fetch named %v; token shown %v", err, named, leaked)
	if err == nil || !named || leaked {
		t.Errorf("validate: %v\n%s", err, out)
	}
}
