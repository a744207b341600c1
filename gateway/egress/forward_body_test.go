package egress

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestProxiedBodyDecided: a forward-proxied request's body is in the
// decision input (input.request.body), decoded from an allowed content
// coding and scanned, so the shipped example rule
// (rego/examples/findings.rego) blocks a credential in it; what was
// decided on is exactly what reaches the upstream; a body that cannot be
// scanned (another coding, too large, trailing data after gzip) is
// refused and nothing is sent. The one-second decision cache keys on the
// body: a clean body's allow is not reused for another body.
func TestProxiedBodyDecided(t *testing.T) {
	rules, err := filepath.Abs("../../rego/examples/findings.rego")
	if err != nil {
		t.Fatal(err)
	}
	be := startBenchEgress(t, "", func(c *config.Config) { c.Rego = []string{rules} })
	var mu sync.Mutex
	var got [][]byte
	be.plain.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, b)
		mu.Unlock()
		_, _ = io.WriteString(w, "ok")
	})
	received := func() [][]byte { mu.Lock(); defer mu.Unlock(); return append([][]byte(nil), got...) }
	c := be.viaProxy(t)
	const key = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
	gz := func(s string, trailing string) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write([]byte(s))
		_ = zw.Close()
		return append(b.Bytes(), trailing...)
	}
	secret := `{"note":"use ` + key + `"}`
	clean := `{"note":"use ` + strings.Repeat("x", len(key)) + `"}` // the same length: only the body differs
	for _, tc := range []struct {
		name     string
		body     []byte
		coding   string
		status   int
		code     string
		forwards bool
	}{
		{"clean body: sent as decided", []byte(clean), "", 200, "", true},
		{"a credential in the body (same head as the clean one, so not the cached allow)", []byte(secret), "", 403, "egress_denied", false},
		{"a credential in a gzip body: decoded and scanned", gz(secret, ""), "gzip", 403, "egress_denied", false},
		{"clean gzip body: the compressed bytes are sent", gz(clean, ""), "gzip", 200, "", true},
		{"a coding that is not on the allow-list", []byte(secret), "br", 415, "schema_violation", false},
		{"two gzip layers", gz(string(gz(secret, "")), ""), "gzip, gzip", 415, "schema_violation", false},
		{"data after the gzip stream", gz(clean, key), "gzip", 400, "schema_violation", false},
		{"over the scan bound", bytes.Repeat([]byte("a"), maxProxiedBody+1), "", 413, "schema_violation", false},
		{"over the scan bound once decoded", gz(strings.Repeat("a", maxProxiedBody+1), ""), "gzip", 413, "schema_violation", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := len(received())
			req, _ := http.NewRequest(http.MethodPost, "http://pkg.example/upload", bytes.NewReader(tc.body))
			req.Header.Set("Content-Type", "application/json")
			if tc.coding != "" {
				req.Header.Set("Content-Encoding", tc.coding)
			}
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != tc.status || (tc.code != "" && errCode(body) != tc.code) {
				t.Fatalf("%d %s, want %d %s", resp.StatusCode, body, tc.status, tc.code)
			}
			if strings.Contains(string(body), key) {
				t.Fatalf("the refusal carries the credential: %s", body)
			}
			after := received()
			switch {
			case tc.forwards && (len(after) != before+1 || !bytes.Equal(after[len(after)-1], tc.body)):
				t.Fatalf("the upstream got %d requests (was %d), last %q; want exactly the decided body", len(after), before, after[len(after)-1])
			case !tc.forwards && len(after) != before:
				t.Fatalf("refused, yet the upstream got a request")
			}
			if tc.code == "egress_denied" && !strings.Contains(string(body), "/request/body") {
				t.Fatalf("the block does not name the body: %s", body)
			}
		})
	}
	blocked := 0
	for _, r := range auditEvents(t, be.g) {
		if r.Event == "decision" && r.Fields["rule"] == "findings.credential" && r.Fields["dest_host"] == "pkg.example" {
			blocked++
		}
	}
	if blocked != 2 {
		t.Fatalf("decision records blocked by findings.credential: %d, want 2", blocked)
	}
}

// TestProxiedBodyStalls: the body is read before the decision, so a body
// that stops arriving is cut at gateway.request_body_timeout (B10) with
// 408 request_timeout, not waited for; nothing is sent.
func TestProxiedBodyStalls(t *testing.T) {
	be := startBenchEgress(t, "", func(c *config.Config) {
		c.Gateway.RequestBodyTimeout = config.Duration(300 * time.Millisecond)
		c.Gateway.RequestBodyMinRate = 0
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := wire.Dial(ctx, be.sock, agentA)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	if _, err := io.WriteString(conn, "POST http://pkg.example/upload HTTP/1.1\r\nHost: pkg.example\r\nContent-Length: 100\r\n\r\n0123456789"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusRequestTimeout || errCode(body) != "request_timeout" || time.Since(start) > 5*time.Second {
		t.Fatalf("stalled body: %d %s after %v; want 408 request_timeout after about 300ms", resp.StatusCode, body, time.Since(start))
	}
	if n := be.requests.Load(); n != 0 {
		t.Fatalf("the upstream got %d requests", n)
	}
}
