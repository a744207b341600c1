package gateway

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
)

// BenchmarkEnvoyCheck is one allowed Check with the credential attached,
// through the real gateway in this process (for profiles; test/bench
// holds the comparison with a bare peer).
func BenchmarkEnvoyCheck(b *testing.B) {
	shm := b.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "sluice-bench-"); err == nil {
		shm = d
		b.Cleanup(func() { os.RemoveAll(d) })
	}
	rego := b.TempDir()
	adapter, _ := os.ReadFile("extauthz/testdata/opa-envoy/adapter.rego")
	os.WriteFile(filepath.Join(rego, "adapter.rego"), adapter, 0o644)
	os.WriteFile(filepath.Join(rego, "envoy.rego"), []byte("package envoy.authz\n\nimport input.attributes.request.http as http_request\n\ndefault allow := false\n\nallow if {\n\thttp_request.method == \"GET\"\n\tinput.parsed_path[0] == \"tickets\"\n}\n"), 0o644)
	g := startEnvoyGateway(b, func(c *config.Config) {
		c.Audit.Path = filepath.Join(shm, "audit.log")
		c.Rego = []string{rego}
	})
	cr := g.checkRequest("HTTP/1.1", "GET", "/tickets?limit=5", nil, nil)
	ctx := context.Background()
	b.ResetTimer()
	for b.Loop() {
		res, err := g.authz.Check(ctx, cr)
		if err != nil || res.GetOkResponse() == nil {
			b.Fatalf("%v %v\n%s", res, err, lastN(g.logBuf.String(), 1500))
		}
	}
}

func lastN(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
