package egress

import (
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/ingress/ingresstest"
)

// TestHandoffEgress: the forward proxy and a CONNECT tunnel work over a
// handed-off *net.TCPConn (Hijack, CloseWrite and the splice use the real
// socket), with the caller's identity.
func TestHandoffEgress(t *testing.T) {
	be := startBenchEgress(t, "", nil)
	proxyURL, _ := url.Parse("http://sluice-proxy")
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(proxyURL),
		TLSClientConfig: be.direct().Transport.(*http.Transport).TLSClientConfig.Clone(),
		DialContext:     ingresstest.NewHandoffDialer(t, be.sock, agentA, "tcp").DialContext,
	}}
	c.Transport.(*http.Transport).TLSClientConfig.ServerName = ""
	c.Transport.(*http.Transport).TLSClientConfig.InsecureSkipVerify = true
	for _, u := range []string{"http://pkg.example/plain", "https://pkg.example/tunnel", "https://pkg.example/again"} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatalf("GET %s over a handoff: %v", u, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := "hello " + strings.TrimPrefix(u[strings.Index(u, "//")+2:], "pkg.example")
		if resp.StatusCode != http.StatusOK || string(b) != want {
			t.Fatalf("GET %s: %d %q, want 200 %q", u, resp.StatusCode, b, want)
		}
	}
	if !hasEvent(t, be.g, "result", "pkg.example") {
		t.Fatal("no audited result for pkg.example")
	}
}
