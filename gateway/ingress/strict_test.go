package ingress

import (
	"bufio"
	"errors"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/h1"
)

// TestHeadChecker runs the framing checker alone over whole connections'
// bytes: keep-alive sequences that are fine pass, smuggling shapes fail.
func TestHeadChecker(t *testing.T) {
	tests := []struct {
		name, in string
		ok       bool
	}{
		{"two keep-alive requests with bodies", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\n\n\n\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n", true},
		{"chunked then another request", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\n\n\r\n\r\n0\r\nX-T: 1\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n", true},
		{"CONNECT then TLS bytes", "CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n\x16\x03\x01\n\n\x00", true},
		{"smuggled second request with CL and TE", "GET /a HTTP/1.1\r\nHost: x\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
		{"chunk data without CRLF", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcX0\r\n\r\n", false},
		{"chunk size not hex", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", false},
		{"obs-fold in a trailer", "POST /a HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\r\n b\r\n\r\n", false},
		{"Content-Length with plus", "POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc", false},
		{"bare LF request line", "GET / HTTP/1.1\nHost: x\r\n\r\n", false},
		// Nothing on the sandbox socket answers 101: a request naming
		// Upgrade stays HTTP, and the head after it is checked.
		{"Upgrade header then a smuggled request", "GET /a HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\nPOST /b HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", false},
		{"Upgrade header then a good request", "GET /a HTTP/1.1\r\nHost: x\r\nUpgrade: h2c\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n", true},
		{"PRI method in HTTP/1.1 then a smuggled request", "PRI /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", false},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, b := net.Pipe()
			defer a.Close()
			go func() { _, _ = io.Copy(io.Discard, a) }()
			h := &headChecker{src: strings.NewReader(tc.in), conn: b}
			_, err := io.ReadAll(io.LimitReader(&oneByte{h}, 1<<20))
			if (err == nil) != tc.ok {
				t.Fatalf("err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// oneByte reads one byte at a time, so that every split point is exercised.
type oneByte struct{ r io.Reader }

func (o *oneByte) Read(p []byte) (int, error) {
	if len(p) > 1 {
		p = p[:1]
	}
	return o.r.Read(p)
}

// FuzzHeadChecker feeds the framing checker arbitrary connection bytes in
// two reads; it must never panic, and a refused stream stays refused.
func FuzzHeadChecker(f *testing.F) {
	f.Add("GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n", 5)                                     // proxy request
	f.Add("CONNECT a:443 HTTP/1.1\r\n\r\n\x16\x03", 3)                                        // tunnel
	f.Add("POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", 40) // chunked
	f.Add("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nx", 1)            // duplicate CL
	f.Fuzz(func(t *testing.T, in string, split int) {
		a, b := net.Pipe()
		defer a.Close()
		go func() { _, _ = io.Copy(io.Discard, a) }()
		h := &headChecker{src: strings.NewReader(in), conn: b}
		if split < 0 || split > len(in) {
			split = len(in) / 2
		}
		buf := make([]byte, len(in)+1)
		_, err1 := h.Read(buf[:max(split, 1)])
		_, err2 := h.Read(buf)
		if err1 == errStrict && err2 != errStrict {
			t.Fatal("a refused stream was read again")
		}
	})
}

// chanListener is a net.Listener that serves the connections sent on it.
type chanListener struct {
	conns chan net.Conn
	done  chan struct{}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}
func (l *chanListener) Close() error   { close(l.done); return nil }
func (l *chanListener) Addr() net.Addr { return &net.UnixAddr{Name: "fuzz", Net: "unix"} }

// checkedConn reads through a headChecker, as strictHeads arranges it.
type checkedConn struct {
	net.Conn
	r io.Reader
}

func (c *checkedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// FuzzRequestHead is a differential check of the strict checker against
// Go's HTTP server, configured as the sandbox server is: whatever the head,
// the first answer is either the handler's (the checker let through a head
// Go accepts) or sluice's JSON refusal, never Go's own text/plain one (or
// its bodiless 417).
func FuzzRequestHead(f *testing.F) {
	f.Add("GET /v1/tools HTTP/1.1\r\nHost: sluice\r\n\r\n")                 // well-formed
	f.Add("GET http://pkg.example/x HTTP/1.1\r\nHost: pkg.example\r\n\r\n") // absolute form
	f.Add("CONNECT pkg.example:443 HTTP/1.1\r\n\r\n")                       // authority form, no Host
	f.Add("GE(T / HTTP/1.1\r\nHost: a\r\n\r\n")                             // method not a token
	f.Add("GET / HTTP/1.1 x\r\nHost: a\r\n\r\n")                            // text after the version
	f.Add("GET / HTTP/2.0\r\nHost: a\r\n\r\n")                              // 505
	f.Add("GET / HTTP/1.1\r\n\r\n")                                         // no Host
	f.Add("GET / HTTP/1.1\r\nHost: a b\r\n\r\n")                            // malformed Host
	f.Add("GET / HTTP/1.1\r\nHost: a\r\nExpect: x\r\n\r\n")                 // 417
	f.Add("\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n")                          // leading empty line
	f.Add("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n") // TE in HTTP/1.0
	f.Add("GET /%zz HTTP/1.1\r\nHost: a\r\n\r\n")                           // bad escape in the target
	l := &chanListener{conns: make(chan net.Conn), done: make(chan struct{})}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("X-Handler", "1")
		}),
		MaxHeaderBytes: MaxHeaderBytes,
		ErrorLog:       log.New(io.Discard, "", 0),
	}
	go func() { _ = srv.Serve(l) }()
	f.Cleanup(func() { _ = srv.Close() })
	f.Fuzz(func(t *testing.T, in string) {
		client, server := socketPair(t)
		defer client.Close()
		h := &headChecker{src: server, conn: server}
		l.conns <- &checkedConn{Conn: server, r: bufio.NewReaderSize(h, 4096)}
		// All of in, then the end of the client's side: an incomplete
		// head is answered at once, not after a timeout.
		go func() {
			_, _ = io.WriteString(client, in)
			_ = client.CloseWrite()
		}()
		_ = client.SetReadDeadline(time.Now().Add(5 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(client), nil)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("head %q: no answer and no close within 5s", in)
		}
		if err != nil {
			return // closed without an answer, as Go's server does before a whole request line
		}
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		if resp.Header.Get("X-Handler") == "1" {
			return
		}
		if resp.Header.Get("Content-Type") != "application/json" || !strings.Contains(string(body), `"error":{"code":`) {
			t.Fatalf("head %q: answered %d %q %q by Go's server, not by the checker", in, resp.StatusCode, resp.Header.Get("Content-Type"), body)
		}
	})
}

// socketPair is a connected pair of Unix stream sockets (net.Pipe has no
// half-close).
func socketPair(t *testing.T) (client, server *net.UnixConn) {
	t.Helper()
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *net.UnixConn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return c.(*net.UnixConn)
	}
	return conn(fds[0]), conn(fds[1])
}

// TestBodyLimitSlowReader (B10): the body bound cuts a body that stalls
// while it is read, but not one whose bytes already arrived and that the
// server is merely slow to read: the time a handler spends elsewhere is
// not the client's.
func TestBodyLimitSlowReader(t *testing.T) {
	sock := t.TempDir() + "/b.sock"
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	lim := h1.BodyLimit{Timeout: 200 * time.Millisecond, MinRate: 500}
	head := "POST /x HTTP/1.1\r\nHost: sluice\r\nContent-Length: 10\r\n\r\n"
	for _, tc := range []struct {
		name  string
		body  string        // sent with the head
		pause time.Duration // before the server reads the body
		cut   bool
	}{
		{"whole body waiting for a slow reader", "0123456789", 600 * time.Millisecond, false},
		{"stalled body", "01234", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cl, err := net.Dial("unix", sock)
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			sv, err := ln.Accept()
			if err != nil {
				t.Fatal(err)
			}
			defer sv.Close()
			if _, err := io.WriteString(cl, head); err != nil {
				t.Fatal(err)
			}
			h := &headChecker{src: sv, conn: sv, lim: lim}
			br := bufio.NewReader(h)
			if _, err := http.ReadRequest(br); err != nil {
				t.Fatal(err)
			}
			// The body arrives after the head was read: it waits in the
			// kernel while the server is busy elsewhere for pause.
			if _, err := io.WriteString(cl, tc.body); err != nil {
				t.Fatal(err)
			}
			time.Sleep(tc.pause)
			start := time.Now()
			buf := make([]byte, 64)
			var got int
			for got < 10 {
				n, err := br.Read(buf)
				got += n
				if err != nil {
					break
				}
			}
			took := time.Since(start)
			if cut := h.state == stFailed; cut != tc.cut {
				t.Fatalf("cut %v after %v (%d bytes read), want %v", cut, took, got, tc.cut)
			}
			if !tc.cut {
				return
			}
			_ = cl.SetReadDeadline(time.Now().Add(5 * time.Second))
			out, _ := io.ReadAll(cl)
			if !strings.HasPrefix(string(out), "HTTP/1.1 408 ") || !strings.Contains(string(out), `"request_timeout"`) {
				t.Errorf("answer %q, want 408 request_timeout", out)
			}
			if took > 3*time.Second {
				t.Errorf("cut after %v, want about the 200ms bound", took)
			}
		})
	}
}
