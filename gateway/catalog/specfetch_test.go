package catalog

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
)

// specServer serves a two-document spec over TLS on loopback and counts
// the requests for each path.
func specServer(t *testing.T) (*httptest.Server, func(string) int) {
	t.Helper()
	const api = `openapi: 3.0.3
info: {title: remote, version: "1"}
servers: [{url: https://api.example.com}]
paths:
  /items/{id}:
    get:
      $ref: ops/get-item.yaml
`
	const op = `operationId: getItem
parameters:
  - {name: id, in: path, required: true, schema: {type: string}}
responses: {"200": {description: ok}}
`
	var mu sync.Mutex
	seen := map[string]int{}
	srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen[r.URL.Path]++
		mu.Unlock()
		switch r.URL.Path {
		case "/spec/api.yaml":
			w.Write([]byte(api))
		case "/spec/ops/get-item.yaml":
			w.Write([]byte(op))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, func(p string) int {
		mu.Lock()
		defer mu.Unlock()
		return seen[p]
	}
}

// TestSpecFetchGuarded: an https spec is fetched through the egress guard
// with the connector's allow_private (THREATS C3 for the spec URL itself):
// inside allow_private it loads, each document fetched once; outside it the
// guard refuses the dial and nothing reaches the server.
func TestSpecFetchGuarded(t *testing.T) {
	srv, seen := specServer(t)
	spec := srv.URL + "/spec/api.yaml"

	t.Run("allowed by allow_private", func(t *testing.T) {
		cl := guard.SpecClient(guard.New(guard.Options{}), []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32")}, 5*time.Second)
		pool := x509.NewCertPool()
		pool.AddCert(srv.Certificate())
		cl.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: pool}
		c, err := connectors.Load(context.Background(), connectors.Options{Slug: "remote", Spec: spec, Client: cl})
		if err != nil {
			t.Fatal(err)
		}
		if len(c.Tools) != 1 || c.Tools[0].Name != "remote.get_item" {
			t.Fatalf("tools = %v, want remote.get_item", c.Tools)
		}
		for _, p := range []string{"/spec/api.yaml", "/spec/ops/get-item.yaml"} {
			if n := seen(p); n != 1 {
				t.Errorf("%s fetched %d times, want 1", p, n)
			}
		}
	})

	t.Run("refused without allow_private", func(t *testing.T) {
		before := seen("/spec/api.yaml")
		cfg := config.Defaults()
		cfg.Connectors = []config.Connector{{Slug: "remote", Spec: spec}}
		_, _, err := Load(context.Background(), cfg, guard.New(guard.Options{}), Options{})
		var de *guard.DeniedError
		if !errors.As(err, &de) || de.Class != guard.Loopback || de.Addr != netip.MustParseAddr("127.0.0.1") {
			t.Fatalf("got %v, want the guard's DeniedError for loopback 127.0.0.1", err)
		}
		if !strings.HasPrefix(err.Error(), "connectors[0].spec: ") {
			t.Errorf("error %q does not name the config key", err)
		}
		if n := seen("/spec/api.yaml") - before; n != 0 {
			t.Errorf("the server got %d requests; the dial must be refused before connecting", n)
		}
	})

	t.Run("admitted by allow_private in Load", func(t *testing.T) {
		// The gateway's client trusts the system roots, not the test
		// server's certificate: getting as far as the TLS handshake shows
		// the guard admitted the dial because of allow_private.
		cfg := config.Defaults()
		cfg.Connectors = []config.Connector{{Slug: "remote", Spec: spec, AllowPrivate: []string{"127.0.0.1/32"}}}
		_, _, err := Load(context.Background(), cfg, guard.New(guard.Options{}), Options{})
		var de *guard.DeniedError
		if err == nil || errors.As(err, &de) || !strings.Contains(err.Error(), "certificate") {
			t.Fatalf("got %v, want a TLS certificate error (the guard admitted the dial)", err)
		}
	})
}
