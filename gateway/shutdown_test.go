package gateway

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
)

// slowDNSUpstream is a real miekg/dns server on 127.0.0.1:0 that answers
// every A question with 93.184.216.34 after delay, counting the questions
// it received.
type slowDNSUpstream struct {
	addr  string
	asked atomic.Int64
}

func newSlowDNSUpstream(t testing.TB, delay time.Duration) *slowDNSUpstream {
	t.Helper()
	u := &slowDNSUpstream{}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	srv := &mdns.Server{PacketConn: pc, Handler: mdns.HandlerFunc(func(w mdns.ResponseWriter, q *mdns.Msg) {
		u.asked.Add(1)
		if strings.HasPrefix(q.Question[0].Name, "slow.") {
			time.Sleep(delay)
		}
		m := new(mdns.Msg)
		m.SetReply(q)
		rr, _ := mdns.NewRR(q.Question[0].Name + " 0 IN A 93.184.216.34")
		m.Answer = append(m.Answer, rr)
		_ = w.WriteMsg(m)
	})}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return u
}

// rawDNSStream opens a egress.DNSStreamType request on a raw sandbox connection
// and returns the connection and the response whose body carries answers.
func rawDNSStream(t *testing.T, g *testGateway) (net.Conn, *http.Response) {
	t.Helper()
	c := rawConn(t, g, agentA)
	_ = c.SetDeadline(time.Now().Add(30 * time.Second))
	head := "POST /v1/dns HTTP/1.1\r\nHost: sluice\r\nContent-Type: " + egress.DNSStreamType + "\r\nTransfer-Encoding: chunked\r\n\r\n"
	if _, err := io.WriteString(c, head); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("stream head: %v", err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != egress.DNSStreamType {
		t.Fatalf("stream refused: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	return c, resp
}

// sendQuestion writes one length-prefixed question as one chunk.
func sendQuestion(t *testing.T, c net.Conn, id uint16, name string) {
	t.Helper()
	q := new(mdns.Msg)
	q.SetQuestion(name, mdns.TypeA)
	q.Id = id
	raw, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	frame := binary.BigEndian.AppendUint16(nil, uint16(len(raw)))
	frame = append(frame, raw...)
	if _, err := fmt.Fprintf(c, "%x\r\n%s\r\n", len(frame), frame); err != nil {
		t.Fatal(err)
	}
}

// readAnswer reads one length-prefixed answer off a stream's body.
func readAnswer(body io.Reader) (*mdns.Msg, error) {
	var l [2]byte
	if _, err := io.ReadFull(body, l[:]); err != nil {
		return nil, err
	}
	buf := make([]byte, binary.BigEndian.Uint16(l[:]))
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, err
	}
	m := new(mdns.Msg)
	return m, m.Unpack(buf)
}

// shutdown ends g's Serve as SIGTERM does (its context) and returns how
// long Serve took to return. It puts Serve's result back for the cleanup.
func shutdown(t *testing.T, g *testGateway, limit time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	g.cancel()
	select {
	case err := <-g.done:
		g.done <- err
		if err != nil {
			t.Errorf("serve: %v", err)
		}
		return time.Since(start)
	case <-time.After(limit):
		t.Fatalf("serve did not return within %v of shutdown", limit)
		return 0
	}
}

// TestShutdownEndsDNSStreams: a graceful shutdown ends the long-lived DNS
// streams of the sandboxes' stubs promptly. Before, Serve waited its whole
// 10s grace for an open stream and returned with the stream still open
// (it ended only at the stream's 2-minute idle time). Now a question in
// flight is still answered, the chunked body ends cleanly (the stub sees
// EOF, not a cut connection, and dials again) and Serve returns as soon as
// the answers in flight are written.
func TestShutdownEndsDNSStreams(t *testing.T) {
	tests := []struct {
		name     string
		inflight bool          // a question the upstream answers after 500ms is in flight at shutdown
		limit    time.Duration // Serve returns within this of the shutdown
	}{
		{"idle stream", false, time.Second},
		{"question in flight is answered first", true, 3 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			up := newSlowDNSUpstream(t, 500*time.Millisecond)
			g := startEgressGateway(t, &egresstest.DNSUpstream{Addr: up.addr}, nil)
			c, resp := rawDNSStream(t, g)
			defer c.Close()
			body := bufio.NewReader(resp.Body)
			sendQuestion(t, c, 1, "a.allowed.test.")
			if m, err := readAnswer(body); err != nil || m.Id != 1 || m.Rcode != mdns.RcodeSuccess {
				t.Fatalf("answer before the shutdown: %v %v", m, err)
			}
			if tc.inflight {
				sendQuestion(t, c, 2, "slow.allowed.test.")
				for deadline := time.Now().Add(5 * time.Second); up.asked.Load() < 2; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatal("the upstream never saw the slow question")
					}
				}
			}
			took := shutdown(t, g, 30*time.Second)
			t.Logf("serve returned %v after the shutdown began", took)
			if took > tc.limit {
				t.Errorf("serve returned %v after the shutdown began, want < %v", took, tc.limit)
			}
			if tc.inflight {
				if m, err := readAnswer(body); err != nil || m.Id != 2 || m.Rcode != mdns.RcodeSuccess {
					t.Fatalf("the question in flight at shutdown: %v %v, want its answer", m, err)
				}
			}
			if _, err := readAnswer(body); !errors.Is(err, io.EOF) {
				t.Fatalf("after the last answer: %v, want io.EOF (a clean end of the chunked body)", err)
			}
		})
	}
}

// TestShutdownStubStreams: the real stub's two streams end at shutdown;
// Serve does not wait for them, and the stub's next question is answered
// at once (not a success: the gateway is gone) instead of hanging.
func TestShutdownStubStreams(t *testing.T) {
	up := newSlowDNSUpstream(t, 0)
	g := startEgressGateway(t, &egresstest.DNSUpstream{Addr: up.addr}, nil)
	fa := egresstest.StreamForwarder(g.cfg.Gateway.SandboxSocket, agentA)
	t.Cleanup(func() { fa.Close() })
	stub := &dns.Stub{Forward: fa.Forward}
	for i := range 2 { // the forwarder takes its two streams in turn: both open
		if m := egresstest.StubAsk(t, stub, fmt.Sprintf("q%d.allowed.test.", i), mdns.TypeA); m.Rcode != mdns.RcodeSuccess {
			t.Fatalf("question %d before the shutdown: %s", i, mdns.RcodeToString[m.Rcode])
		}
	}
	if took := shutdown(t, g, 30*time.Second); took > time.Second {
		t.Errorf("serve returned %v after the shutdown began, want < 1s", took)
	}
	start := time.Now()
	m := egresstest.StubAsk(t, stub, "after.allowed.test.", mdns.TypeA)
	if m.Rcode == mdns.RcodeSuccess {
		t.Errorf("a question after the shutdown was answered NOERROR")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a question after the shutdown took %v, want < 2s", took)
	}
}
