//go:build linux

package e2e

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"golang.org/x/net/http2"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// TestInterceptHTTP2: a client that speaks HTTP/2 in an intercepted
// tunnel gets it (and the upstream too, when it offers it), each stream
// is decided and credentialed as its own request, and trailers — gRPC's
// status — come through, scrubbed like the rest of the reply.
func TestInterceptHTTP2(t *testing.T) {
	requireHost(t)
	w := newInterceptWorld(t)
	c := w.client(t, w.gatewayCA)
	tr := c.Transport.(*http.Transport)
	tr.ForceAttemptHTTP2, tr.DisableKeepAlives = true, false
	defer c.CloseIdleConnections()
	bearer := http.Header{"Authorization": {"Bearer " + w.placeholder}}

	t.Run("HTTP/2 both sides, placeholder substituted", func(t *testing.T) {
		resp, body := w.do(t, c, "GET", "https://api.test/user", "", bearer, "")
		if resp.StatusCode != 200 || resp.Proto != "HTTP/2.0" || body != "hello from api.test /user" {
			t.Fatalf("got %d %s %q", resp.StatusCode, resp.Proto, body)
		}
		reqs := w.requests()
		if last := reqs[len(reqs)-1]; last.proto != "HTTP/2.0" || last.auth != "Bearer "+w.e.Secret {
			t.Fatalf("upstream saw %s, Authorization with the secret: %v", last.proto, last.auth == "Bearer "+w.e.Secret)
		}
	})
	t.Run("concurrent streams in one tunnel, each decided", func(t *testing.T) {
		// One request opens the tunnel; the 8 then share it.
		if resp, _ := w.do(t, c, "GET", "https://other.test/warm", "", nil, ""); resp.StatusCode != 200 {
			t.Fatalf("warm-up: %d", resp.StatusCode)
		}
		before := countEvent(w.g.For(t).AuditRecords(), "decision", "other.test")
		var wg sync.WaitGroup
		errs := make(chan string, 8)
		for i := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := c.Get("https://other.test/s" + string(rune('a'+i)))
				if err != nil {
					errs <- err.Error()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.Proto != "HTTP/2.0" || !strings.HasPrefix(string(b), "hello from other.test /s") {
					errs <- resp.Proto + " " + string(b)
				}
			}()
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		// One decision per stream, none for a new tunnel.
		if n := countEvent(w.g.For(t).AuditRecords(), "decision", "other.test") - before; n != 8 {
			t.Fatalf("%d decision records for 8 streams in one tunnel, want 8", n)
		}
	})
	t.Run("blocked path is 403 on its stream only", func(t *testing.T) {
		resp, body := w.do(t, c, "GET", "https://api.test/admin/x", "", bearer, "")
		if resp.StatusCode != 403 || !strings.Contains(body, `"egress_denied"`) {
			t.Fatalf("got %d %s", resp.StatusCode, body)
		}
		if resp, _ := w.do(t, c, "GET", "https://api.test/user", "", bearer, ""); resp.StatusCode != 200 {
			t.Fatalf("the next stream: %d", resp.StatusCode)
		}
	})
	t.Run("trailers pass, TE: trailers kept, secret scrubbed from them", func(t *testing.T) {
		hdr := http.Header{"Authorization": {"Bearer " + w.placeholder}, "Te": {"trailers"}}
		resp, body := w.do(t, c, "POST", "https://api.test/trailers", "x", hdr, "")
		if resp.StatusCode != 200 || body != "body" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
		if got := resp.Trailer.Get("Grpc-Status"); got != "0" {
			t.Fatalf("Grpc-Status trailer %q (trailers %v)", got, resp.Trailer)
		}
		echo := resp.Trailer.Get("X-Echo")
		w.e.Keep([]byte(echo))
		casebook.Expect(t, "D3", "upstream echoes the substituted Authorization in an HTTP/2 trailer (intercepted tunnel)",
			"trailer scrubbed, audit secret_reflected").
			Observef("trailer X-Echo %q, secret in it: %v", echo, strings.Contains(echo, w.e.Secret))
		if strings.Contains(echo, w.e.Secret) || !strings.HasPrefix(echo, "Bearer ") {
			t.Fatalf("X-Echo trailer carries the secret: %v", strings.Contains(echo, w.e.Secret))
		}
		w.g.For(t).AwaitAuditFields("secret_reflected", map[string]any{"dest_host": "api.test"})
	})
	t.Run("the gateway allows 16 streams at once per tunnel", func(t *testing.T) {
		conn := w.tunnelALPN(t, "other.test", "h2")
		defer conn.Close()
		if _, err := io.WriteString(conn, http2.ClientPreface); err != nil {
			t.Fatal(err)
		}
		fr := http2.NewFramer(conn, conn)
		if err := fr.WriteSettings(); err != nil {
			t.Fatal(err)
		}
		f, err := fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		sf, ok := f.(*http2.SettingsFrame)
		if !ok {
			t.Fatalf("first frame %T, want SETTINGS", f)
		}
		if v, ok := sf.Value(http2.SettingMaxConcurrentStreams); !ok || v != 16 {
			t.Fatalf("SETTINGS_MAX_CONCURRENT_STREAMS = %d (sent %v), want 16", v, ok)
		}
	})
	t.Run("HTTP/1.1 clients are still served", func(t *testing.T) {
		h1 := w.client(t, w.gatewayCA)
		resp, body := w.do(t, h1, "GET", "https://other.test/h1", "", nil, "")
		if resp.StatusCode != 200 || resp.Proto != "HTTP/1.1" || body != "hello from other.test /h1" {
			t.Fatalf("got %d %s %q", resp.StatusCode, resp.Proto, body)
		}
	})
}
