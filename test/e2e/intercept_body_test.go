//go:build linux

package e2e

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// TestInterceptedStalledBody is THREATS B10 inside an intercepted tunnel:
// the inner request's body is not read by the sandbox socket's framing
// checker (it is TLS there), so its own bound applies: with
// request_body_timeout 2s, a body that stops arriving is answered 408
// request_timeout and its result record carries that code.
func TestInterceptedStalledBody(t *testing.T) {
	requireHost(t)
	w := newInterceptWorld(t)
	c := w.client(t, w.gatewayCA)
	cb := casebook.Expect(t, "B10", "inside an intercepted tunnel to other.test, a POST announces Content-Length 100, sends 2 bytes and stalls; request_body_timeout 2s",
		"408 request_timeout within the bound; the result record has code request_timeout")
	pr, pw := io.Pipe()
	defer pw.Close()
	req, err := http.NewRequest(http.MethodPost, "https://other.test/upload", pr)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = 100
	go func() { _, _ = io.WriteString(pw, "{}") }() // then nothing
	// Without the bound nothing ends the request: give up, and fail, after 15s.
	stop := time.AfterFunc(15*time.Second, func() { pw.CloseWithError(errors.New("test: no answer within 15s")) })
	defer stop.Stop()
	start := time.Now()
	resp, err := c.Do(req)
	took := time.Since(start)
	if err != nil {
		t.Fatalf("after %v: %v\n%s", took, err, w.g.Stderr())
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var eb struct{ Error struct{ Code string } }
	_ = json.Unmarshal(b, &eb)
	status, code := resp.StatusCode, eb.Error.Code
	if status != http.StatusRequestTimeout || code != "request_timeout" {
		// Before waiting for a record that cannot come.
		t.Fatalf("after %v got %d %s, want 408 request_timeout\n%s", took, resp.StatusCode, b, w.g.Stderr())
	}
	rec := w.g.AwaitAuditFields("result", map[string]any{"dest_host": "other.test", "code": "request_timeout"})
	cb.Observef("%d %s after %v; result record code %v", status, code, took.Round(100*time.Millisecond), rec["fields"].(map[string]any)["code"])
	if took < 2*time.Second || took > 10*time.Second {
		t.Errorf("cut after %v, want about the 2s bound", took)
	}
}
