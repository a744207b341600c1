//go:build linux

package attack

import (
	"context"
	"encoding/pem"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestSpecFetchGuarded is THREATS C14: a connector whose spec is an
// https:// URL on the host's loopback (a listener this test runs) is
// fetched through the egress guard, as an upstream call would be. Without
// allow_private covering it, `sluice validate` fails naming the guard's
// refusal and the listener sees no request; with allow_private it loads.
func TestSpecFetchGuarded(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	spec, err := os.ReadFile(e.Spec)
	if err != nil {
		t.Fatal(err)
	}
	var hits atomic.Int64
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		if r.URL.Path != "/specs/tickets.yaml" {
			http.NotFound(w, r)
			return
		}
		w.Write(spec)
	}))
	defer srv.Close()
	caFile := filepath.Join(e.Dir, "spec-ca.pem")
	if err := os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	// validate runs the real binary, trusting the test server's certificate
	// (so that, once admitted, the fetch succeeds).
	validate := func(allow []string) (string, error) {
		d := e.BaseConfig("specfetch")
		cc := d["connectors"].([]map[string]any)[0]
		cc["spec"] = srv.URL + "/specs/tickets.yaml"
		cc["base_url"] = "https://tickets.test"
		cc["allow_private"] = allow
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, e.Bin, "validate", "--config", e.Write(d))
		cmd.Env = append(os.Environ(), "SSL_CERT_FILE="+caFile)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}

	t.Run("C14 spec URL on loopback without allow_private", func(t *testing.T) {
		c := casebook.Expect(t, "C14", "connectors[0].spec is https://127.0.0.1:<port>/specs/tickets.yaml (a listener on the host's loopback), no allow_private; sluice validate",
			"exit non-zero; the error names connectors[0].spec and the guard's refusal (loopback); 0 requests reach the listener")
		before := hits.Load()
		out, err := validate(nil)
		n := hits.Load() - before
		refused := strings.Contains(out, "connectors[0].spec") && strings.Contains(out, `guard: egress denied: host "127.0.0.1" address 127.0.0.1 is loopback`)
		c.Observef("exit %v, guard refusal named %v, requests %d", err, refused, n)
		if err == nil || !refused {
			t.Errorf("validate: %v\n%s", err, out)
		}
		if n != 0 {
			t.Errorf("%d requests reached the listener; the guard must refuse the dial", n)
		}
	})
	t.Run("C14 control: allow_private covers the spec's address", func(t *testing.T) {
		c := casebook.Expect(t, "C14", "control: the same spec URL with allow_private [127.0.0.1/32]",
			"validate ok; the listener served the spec (the refusal above is the guard's)")
		before := hits.Load()
		out, err := validate([]string{"127.0.0.1/32"})
		n := hits.Load() - before
		c.Observef("exit %v, requests %d", err, n)
		if err != nil || !strings.Contains(out, "ok: 1 connectors") {
			t.Errorf("validate: %v\n%s", err, out)
		}
		if n == 0 {
			t.Error("the listener got no request")
		}
	})
}

// TestSpecRefsConfined is THREATS F9 through the real binary: a connector
// spec whose operation-level $ref climbs out of the spec's directory (to a
// file beside the config that holds a secret) fails `sluice validate`
// naming the ref, and nothing of the file appears in the output.
func TestSpecRefsConfined(t *testing.T) {
	e := gwenv.New(t, gatewayBin(t))
	const canary = "canary-" + "8f1d2c"
	if err := os.WriteFile(filepath.Join(e.Dir, "outside.yaml"), []byte("operationId: leak\ndescription: "+canary+"\nresponses: {'200': {description: ok}}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.Dir, "specs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := filepath.Join(dir, "api.yaml")
	body := "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'https://tickets.test'}]\npaths:\n  /leak:\n    get: {$ref: '../outside.yaml'}\n"
	if err := os.WriteFile(spec, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	c := casebook.Expect(t, "F9", "connectors[0].spec has `get: {$ref: '../outside.yaml'}` (an operation-level $ref out of the spec's directory); sluice validate",
		"exit non-zero; the error names connectors[0].spec and \"outside the spec's directory\"; the file's content is not shown")
	d := e.BaseConfig("specref")
	d["connectors"].([]map[string]any)[0]["spec"] = spec
	out, err := e.CLI("", "validate", "--config", e.Write(d))
	named := strings.Contains(out, "connectors[0].spec") && strings.Contains(out, "outside the spec's directory")
	leaked := strings.Contains(out, canary)
	c.Observef("exit %v, refusal named %v, content shown %v", err, named, leaked)
	if err == nil || !named || leaked {
		t.Errorf("validate: %v\n%s", err, out)
	}
}
