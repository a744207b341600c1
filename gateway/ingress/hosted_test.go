package ingress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
)

func reqOf(t *testing.T, raw string) *http.Request {
	t.Helper()
	r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
	if err != nil {
		t.Fatalf("%q: %v", raw, err)
	}
	return r
}

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestHostedCredential: the credential is exactly one Basic
// Proxy-Authorization, or for a tool API request without one, exactly
// one Basic Authorization; anything else is refused with its reason.
func TestHostedCredential(t *testing.T) {
	for _, tc := range []struct {
		name, raw, session, token, why string
	}{
		{"proxy request", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic " + b64("s1:tok") + "\r\n\r\n", "s1", "tok", ""},
		{"CONNECT", "CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nProxy-Authorization: basic " + b64("s1:tok:with:colons") + "\r\n\r\n", "s1", "tok:with:colons", ""},
		{"tool API with Authorization", "POST /v1/tools/x HTTP/1.1\r\nHost: s\r\nAuthorization: Basic " + b64("s1:tok") + "\r\n\r\n", "s1", "tok", ""},
		{"Authorization on a proxy request is the upstream's, not ours", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nAuthorization: Basic " + b64("s1:tok") + "\r\n\r\n", "", "", "missing"},
		{"Authorization on CONNECT is not ours either", "CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nAuthorization: Basic " + b64("s1:tok") + "\r\n\r\n", "", "", "missing"},
		{"two Proxy-Authorization", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic " + b64("s1:a") + "\r\nProxy-Authorization: Basic " + b64("s2:b") + "\r\n\r\n", "", "", "several_credentials"},
		{"bearer", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Bearer tok\r\n\r\n", "", "", "not_basic"},
		{"not base64", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic %%%\r\n\r\n", "", "", "malformed"},
		{"no colon", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic " + b64("justatoken") + "\r\n\r\n", "", "", "malformed"},
		{"empty user", "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic " + b64(":tok") + "\r\n\r\n", "", "", "malformed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, s, tok, why := credential(reqOf(t, tc.raw))
			if s != tc.session || tok != tc.token || why != tc.why {
				t.Fatalf("credential = %q %q %q, want %q %q %q", s, tok, why, tc.session, tc.token, tc.why)
			}
		})
	}
}

// TestPeekHead: the head is found whole, however it arrives, and left
// in the reader for the server.
func TestPeekHead(t *testing.T) {
	head := "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"
	br := bufio.NewReaderSize(&oneByte{r: strings.NewReader(head + "BODY")}, 4096)
	got, err := peekHead(br)
	if err != nil || string(got) != head {
		t.Fatalf("peekHead = %q %v", got, err)
	}
	rest := new(bytes.Buffer)
	_, _ = rest.ReadFrom(br)
	if !strings.HasPrefix(rest.String(), head) {
		t.Fatalf("the head was consumed: %q", rest.String())
	}
	if _, err := peekHead(bufio.NewReaderSize(strings.NewReader(strings.Repeat("X", 5000)), 4096)); err != bufio.ErrBufferFull {
		t.Fatalf("an endless head: %v, want ErrBufferFull", err)
	}
	if _, err := peekHead(bufio.NewReaderSize(strings.NewReader("GET / HTTP/1.1\r\n"), 4096)); err == nil {
		t.Fatal("a cut head was found")
	}
}

// FuzzHostedCredential: no request head panics the credential parser, and
// a credential it accepts is Basic with a non-empty session and token.
func FuzzHostedCredential(f *testing.F) {
	f.Add("GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nProxy-Authorization: Basic " + b64("s1:tok") + "\r\n\r\n") // accepted
	f.Add("CONNECT a.test:443 HTTP/1.1\r\nHost: a.test:443\r\nProxy-Authorization: Basic\r\n\r\n")                   // no value
	f.Add("POST /v1/tools/x HTTP/1.1\r\nHost: s\r\nAuthorization: Basic Og==\r\n\r\n")                               // ":" alone
	f.Fuzz(func(t *testing.T, raw string) {
		r, err := http.ReadRequest(bufio.NewReader(strings.NewReader(raw)))
		if err != nil {
			return
		}
		cred, s, tok, why := credential(r)
		if why == "" && (s == "" || tok == "" || !strings.EqualFold(cred[:5], "basic")) {
			t.Fatalf("accepted %q as %q %q", cred, s, tok)
		}
	})
}

// TestHostedPendingCap: connections still being identified are capped
// (MaxHostedPending); one more is closed at once, before TLS, and counted
// gateway_busy; a connection that speaks no TLS is refused by the
// handshake and counted untrusted_peer.
func TestHostedPendingCap(t *testing.T) {
	var mu sync.Mutex
	codes := map[refusal.Code]int{}
	l, err := Listen(Options{Socket: filepath.Join(t.TempDir(), "s.sock"), TrustedUIDs: []uint32{0},
		Refused: func(c refusal.Code) { mu.Lock(); codes[c]++; mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// A certificate is not needed to be refused: no handshake completes.
	addr, err := l.ListenHosted("127.0.0.1:0", &tls.Config{}, HostedOptions{Check: func(context.Context, string, string) HostedVerdict {
		return HostedVerdict{Refused: "bug"}
	}})
	if err != nil {
		t.Fatal(err)
	}
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range MaxHostedPending {
		c, err := net.Dial("tcp", addr.String())
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c) // silent: each holds a place until preambleTimeout
	}
	count := func(c refusal.Code) int { mu.Lock(); defer mu.Unlock(); return codes[c] }
	extra, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	idle = append(idle, extra)
	for deadline := time.Now().Add(5 * time.Second); count(refusal.GatewayBusy) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no connection was refused gateway_busy past MaxHostedPending")
		}
	}
	// Which one was refused depends on goroutine order; exactly one of
	// them was closed at once, the rest still wait for their handshake.
	until := time.Now().Add(300 * time.Millisecond)
	var closed atomic.Int64
	var wg sync.WaitGroup
	for _, c := range idle {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = c.SetReadDeadline(until)
			if _, err := c.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
				closed.Add(1)
			}
		}()
	}
	wg.Wait()
	if closed.Load() != 1 || count(refusal.GatewayBusy) != 1 {
		t.Fatalf("%d connections closed at once, %d counted gateway_busy; want 1 and 1", closed.Load(), count(refusal.GatewayBusy))
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	c, err := net.Dial("tcp", addr.String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n") // plaintext
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	b, _ := io.ReadAll(c)
	if bytes.Contains(b, []byte("HTTP/1.1 200")) {
		t.Fatalf("plaintext was answered: %q", b)
	}
	for deadline := time.Now().Add(5 * time.Second); count(refusal.UntrustedPeer) == 0; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("a plaintext connection was not refused by the handshake")
		}
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
