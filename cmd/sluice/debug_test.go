package main

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// serve --debug-listen serves the CPU, mutex and block profiles of the
// running gateway on loopback, and nothing that shows its memory or
// command line.
func TestServeDebugListen(t *testing.T) {
	cfgPath := demoConfig(t)
	sv := startServe(t, "--config", cfgPath, "--log-format", "json", "--log-flush", "0", "--debug-listen", "127.0.0.1:0")
	var addr string
	deadline := time.Now().Add(30 * time.Second)
	for addr == "" {
		for _, l := range strings.Split(sv.stderr.String(), "\n") {
			var line struct {
				Msg, Addr string
			}
			if json.Unmarshal([]byte(l), &line) == nil && line.Msg == "debug: profiles served" {
				addr = line.Addr
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no debug listener in the log after 30s:\n%s", sv.stderr)
		}
		time.Sleep(20 * time.Millisecond)
	}
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := http.Get("http://" + addr + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, b
	}
	gzipMagic := []byte{0x1f, 0x8b} // a profile is a gzipped protobuf
	for _, p := range []string{"/debug/pprof/profile?seconds=1", "/debug/pprof/mutex", "/debug/pprof/block?seconds=1", "/debug/pprof/allocs"} {
		st, b := get(p)
		if st != http.StatusOK || !bytes.HasPrefix(b, gzipMagic) {
			t.Errorf("GET %s: %d, %d bytes starting %q; want 200 and a gzipped profile", p, st, len(b), b[:min(len(b), 16)])
		}
	}
	for _, p := range []string{"/debug/pprof/cmdline", "/debug/pprof/goroutine", "/debug/pprof/", "/metrics"} {
		if st, _ := get(p); st != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", p, st)
		}
	}
	sv.stop(t)
}
