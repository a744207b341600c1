package dns

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"runtime"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// answerPlain answers an A question with 192.0.2.1 in the shape the
// gateway's fast path writes (AppendAnswer), which the stub passes on
// without unpacking it.
func answerPlain(ctx context.Context, query []byte) ([]byte, error) {
	q, ok := ParseQuery(query)
	if !ok {
		return answerA(ctx, query)
	}
	return AppendAnswer(nil, &q, mdns.RcodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 60), nil
}

// udpAsk sends m to the stub's UDP address and returns the parsed reply.
func udpAsk(t *testing.T, addr string, m *mdns.Msg) *mdns.Msg {
	t.Helper()
	c := &mdns.Client{Net: "udp", Timeout: 3 * time.Second, UDPSize: 512}
	r, _, err := c.Exchange(m, addr)
	if err != nil {
		t.Fatalf("exchange: %v", err)
	}
	return r
}

// TestStubUDPStream covers the UDP fast path of a Stub with a Stream: the
// plain query travels on the stream as it is and its answer comes back
// under the client's ID with the question as asked; every answer that is
// not in the plain shape, or does not fit, or does not match, or never
// comes, is handled as the full path handles it.
func TestStubUDPStream(t *testing.T) {
	wrongName := func(_ context.Context, q []byte) ([]byte, error) {
		pq, _ := ParseQuery(q)
		other := mustPack(query("other.example", pq.Type))
		oq, _ := ParseQuery(other)
		oq.ID = pq.ID
		return AppendAnswer(nil, &oq, mdns.RcodeSuccess, nil, 0), nil
	}
	many := func(_ context.Context, q []byte) ([]byte, error) {
		pq, _ := ParseQuery(q)
		var addrs []netip.Addr
		for i := range 60 {
			addrs = append(addrs, netip.MustParseAddr(fmt.Sprintf("2001:db8::%x", i+1)))
		}
		return AppendAnswer(nil, &pq, mdns.RcodeSuccess, addrs, 60), nil
	}
	silent := func(context.Context, []byte) ([]byte, error) { return nil, nil }
	edns := query("a.example", mdns.TypeA).SetEdns0(1232, false)
	tests := []struct {
		name    string
		answer  func(context.Context, []byte) ([]byte, error)
		q       *mdns.Msg
		rcode   int
		answers int // records in the reply (unless truncated)
		tc      bool
		asked   int64 // questions the gateway saw
	}{
		{"plain answer passed on, case as asked (0x20)", answerPlain, query("A.ExAmple", mdns.TypeA), mdns.RcodeSuccess, 1, false, 1},
		{"uncompressed answer checked in full", answerA, query("a.example", mdns.TypeA), mdns.RcodeSuccess, 1, false, 1},
		{"answer to another question: REFUSED", wrongName, query("a.example", mdns.TypeA), mdns.RcodeRefused, 0, false, 1},
		{"no answer within Timeout: REFUSED", silent, query("a.example", mdns.TypeA), mdns.RcodeRefused, 0, false, 1},
		{"answer over 512 bytes: truncated with TC (RFC 1035 4.2.1)", many, query("big.example", mdns.TypeAAAA), mdns.RcodeSuccess, 0, true, 1},
		{"C7 TXT: NOTIMP, never forwarded", answerPlain, query("a.example", mdns.TypeTXT), mdns.RcodeNotImplemented, 0, false, 0},
		{"EDNS takes the full path", answerA, edns, mdns.RcodeSuccess, 1, false, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startStreamPeer(t, &streamPeer{answer: tc.answer})
			f := &StreamForwarder{Dial: p.dial}
			t.Cleanup(func() { f.Close() })
			udp, _ := startStub(t, &Stub{Forward: f.Forward, Stream: f, Timeout: 300 * time.Millisecond})
			r := udpAsk(t, udp, tc.q)
			if r.Id != tc.q.Id || !r.Response || r.Rcode != tc.rcode || (!tc.tc && len(r.Answer) != tc.answers) || r.Truncated != tc.tc {
				t.Fatalf("reply id %#x rcode %s, %d answers, TC %v; want id %#x %s, %d answers, TC %v",
					r.Id, mdns.RcodeToString[r.Rcode], len(r.Answer), r.Truncated, tc.q.Id, mdns.RcodeToString[tc.rcode], tc.answers, tc.tc)
			}
			if len(r.Question) != 1 || r.Question[0].Name != tc.q.Question[0].Name {
				t.Errorf("question %v, want %q exactly as asked", r.Question, tc.q.Question[0].Name)
			}
			if n := p.asked.Load(); n != tc.asked {
				t.Errorf("the gateway saw %d questions, want %d", n, tc.asked)
			}
		})
	}
}

// TestStubUDPStreamConcurrent: many clients in flight at once, all with the
// same DNS ID, answered out of order over the batched path, each get their
// own answer; and a stream that ends fails its questions REFUSED, after
// which the next question gets a fresh stream.
func TestStubUDPStreamConcurrent(t *testing.T) {
	p := startStreamPeer(t, &streamPeer{answer: answerPlain})
	f := &StreamForwarder{Dial: p.dial}
	t.Cleanup(func() { f.Close() })
	udp, _ := startStub(t, &Stub{Forward: f.Forward, Stream: f, MaxInflight: 256})
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := fmt.Sprintf("n%d.example.", i)
			q := new(mdns.Msg).SetQuestion(name, mdns.TypeA)
			q.Id = 7
			c := &mdns.Client{Net: "udp", Timeout: 3 * time.Second}
			r, _, err := c.Exchange(q, udp)
			if err != nil {
				t.Error(err)
				return
			}
			if r.Id != 7 || r.Rcode != mdns.RcodeSuccess || r.Question[0].Name != name || len(r.Answer) != 1 {
				t.Errorf("%s: reply %v", name, r)
			}
		}()
	}
	wg.Wait()
	if n := p.streams.Load(); n > DefaultStreamConns {
		t.Errorf("%d streams, want at most %d", n, DefaultStreamConns)
	}
}

// TestStubUDPStreamEnds: questions in flight when their stream ends are
// REFUSED at once (not after Timeout), and the next question gets a new
// stream.
func TestStubUDPStreamEnds(t *testing.T) {
	var (
		mu   sync.Mutex
		kill = true
	)
	p := &streamPeer{}
	p.answer = func(ctx context.Context, q []byte) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		if kill {
			kill = false
			return nil, fmt.Errorf("end the stream")
		}
		return answerPlain(ctx, q)
	}
	startStreamPeer(t, p)
	f := &StreamForwarder{Dial: p.dial, Conns: 1}
	t.Cleanup(func() { f.Close() })
	udp, _ := startStub(t, &Stub{Forward: f.Forward, Stream: f, Timeout: 10 * time.Second})
	start := time.Now()
	if r := udpAsk(t, udp, query("a.example", mdns.TypeA)); r.Rcode != mdns.RcodeRefused {
		t.Fatalf("question on a stream that ends: %s, want REFUSED", mdns.RcodeToString[r.Rcode])
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("REFUSED after %v, want at once when the stream ends", d)
	}
	if r := udpAsk(t, udp, query("a.example", mdns.TypeA)); r.Rcode != mdns.RcodeSuccess {
		t.Fatalf("next question: %s, want NOERROR on a new stream", mdns.RcodeToString[r.Rcode])
	}
	if n := p.streams.Load(); n != 2 {
		t.Errorf("%d streams, want 2", n)
	}
}

// TestUDPServerSend: replies to one client go out as one GSO send where
// the kernel supports it, and arrive as separate datagrams, each whole;
// replies of other sizes and to other clients arrive as well.
func TestUDPServerSend(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	u := &udpServer{s: &Stub{}, pc: batchConn(pc), rc: gsoConn(pc)}
	u.gso.Store(u.rc != nil)
	var clients [2]net.PacketConn
	for i := range clients {
		if clients[i], err = net.ListenPacket("udp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
		defer clients[i].Close()
	}
	want := [2]map[string]bool{{}, {}}
	for i := range 40 {
		c := i % 2
		size := 40
		if i%5 == 0 {
			size = 41 // another size: its own send
		}
		b := bytes.Repeat([]byte{byte(i)}, size)
		want[c][string(b)] = true
		u.queue(b, clients[c].LocalAddr())
	}
	u.flush()
	for c, cl := range clients {
		buf := make([]byte, 1024)
		for range len(want[c]) {
			_ = cl.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, _, err := cl.ReadFrom(buf)
			if err != nil {
				t.Fatalf("client %d: %v (%d datagrams missing)", c, err, len(want[c]))
			}
			if !want[c][string(buf[:n])] {
				t.Fatalf("client %d: unexpected or repeated datagram of %d bytes", c, n)
			}
			delete(want[c], string(buf[:n]))
		}
	}
	if runtime.GOOS == "linux" && !u.gso.Load() {
		t.Log("the kernel refused UDP GSO; replies went one by one")
	}
}
