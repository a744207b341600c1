package dns

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// streamPeer is a net/http server on a loopback Unix socket that speaks
// the gateway's side of the stream protocol with answer (answerA by
// default): it answers every batch of questions it has read in reverse
// order, so answers overtake each other. With refuse set it answers every
// POST like a gateway that has no streams: 415 before reading the body.
type streamPeer struct {
	path    string
	refuse  bool
	streams atomic.Int64 // stream requests accepted
	posts   atomic.Int64 // single-question requests answered
	badIDs  bool         // answer with an ID no question has
	asked   atomic.Int64 // questions read from streams

	// answer, if set, answers a streamed question instead of answerA;
	// a nil answer and nil error leave the question unanswered.
	answer func(ctx context.Context, q []byte) ([]byte, error)
}

func startStreamPeer(t *testing.T, p *streamPeer) *streamPeer {
	t.Helper()
	p.path = t.TempDir() + "/gw.sock"
	l, err := net.Listen("unix", p.path)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(p.serve)}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return p
}

func (p *streamPeer) serve(w http.ResponseWriter, r *http.Request) {
	if r.Header.Get("Content-Type") == "application/dns-message" {
		p.posts.Add(1)
		q, _ := io.ReadAll(r.Body)
		a, err := answerA(r.Context(), q)
		if err != nil {
			http.Error(w, "bad", http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "application/dns-message")
		w.Write(a)
		return
	}
	if p.refuse || r.Header.Get("Content-Type") != StreamContentType {
		http.Error(w, "unsupported", http.StatusUnsupportedMediaType)
		return
	}
	p.streams.Add(1)
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		return
	}
	w.Header().Set("Content-Type", StreamContentType)
	w.Write(nil)
	rc.Flush()
	br := bufio.NewReader(r.Body)
	for {
		var batch [][]byte
		for len(batch) == 0 || br.Buffered() > 0 {
			var l [2]byte
			if _, err := io.ReadFull(br, l[:]); err != nil {
				return
			}
			q := make([]byte, binary.BigEndian.Uint16(l[:]))
			if _, err := io.ReadFull(br, q); err != nil {
				return
			}
			batch = append(batch, q)
			p.asked.Add(1)
		}
		answer := answerA
		if p.answer != nil {
			answer = p.answer
		}
		for i := len(batch) - 1; i >= 0; i-- {
			a, err := answer(r.Context(), batch[i])
			if err != nil {
				return
			}
			if a == nil {
				continue
			}
			if p.badIDs {
				a[0] ^= 0xff
			}
			w.Write(binary.BigEndian.AppendUint16(nil, uint16(len(a))))
			w.Write(a)
		}
		rc.Flush()
	}
}

func (p *streamPeer) dial(ctx context.Context) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "unix", p.path)
}

func askStub(t *testing.T, st *Stub, name string, id uint16) *mdns.Msg {
	t.Helper()
	q := query(name, mdns.TypeA)
	q.Id = id
	raw, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	m := new(mdns.Msg)
	if err := m.Unpack(st.Answer(context.Background(), raw, 0)); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	return m
}

// TestStreamForwarder covers the transport's outcomes through a Stub: an
// answer over a stream keeps the question's ID; a gateway without streams
// is asked one POST per question (Fallback) or, without Fallback, every
// question is REFUSED; a failing dial and a stream whose answers match no
// question are REFUSED (the sandbox learns nothing from a broken path).
func TestStreamForwarder(t *testing.T) {
	tests := []struct {
		name     string
		peer     *streamPeer
		fallback bool
		dialErr  bool
		rcode    int
		streams  int64 // streams the peer accepted
		posts    int64 // single-question POSTs the peer answered
	}{
		{"stream answers", &streamPeer{}, true, false, mdns.RcodeSuccess, 1, 0},
		{"gateway without streams: fallback", &streamPeer{refuse: true}, true, false, mdns.RcodeSuccess, 0, 3},
		{"gateway without streams, no fallback: REFUSED", &streamPeer{refuse: true}, false, false, mdns.RcodeRefused, 0, 0},
		{"dial fails: REFUSED", &streamPeer{}, true, true, mdns.RcodeRefused, 0, 0},
		{"answers match no question: REFUSED", &streamPeer{badIDs: true}, false, false, mdns.RcodeRefused, 1, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startStreamPeer(t, tc.peer)
			f := &StreamForwarder{Dial: p.dial, Conns: 1}
			if tc.dialErr {
				f.Dial = func(context.Context) (net.Conn, error) { return nil, errors.New("no gateway") }
			}
			if tc.fallback {
				f.Fallback = func(ctx context.Context, q []byte) ([]byte, error) {
					c := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) { return p.dial(ctx) }}}
					req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://sluice/v1/dns", bytes.NewReader(q))
					req.Header.Set("Content-Type", "application/dns-message")
					resp, err := c.Do(req)
					if err != nil {
						return nil, err
					}
					defer resp.Body.Close()
					return io.ReadAll(resp.Body)
				}
			}
			t.Cleanup(func() { f.Close() })
			st := &Stub{Forward: f.Forward, Timeout: time.Second}
			for i := range 3 {
				m := askStub(t, st, "a.example", uint16(0x100+i))
				if m.Rcode != tc.rcode || m.Id != uint16(0x100+i) {
					t.Fatalf("question %d: rcode %s id %#x, want %s id %#x", i, mdns.RcodeToString[m.Rcode], m.Id, mdns.RcodeToString[tc.rcode], 0x100+i)
				}
			}
			if s, n := p.streams.Load(), p.posts.Load(); s != tc.streams || n != tc.posts {
				t.Errorf("peer saw %d streams and %d posts, want %d and %d", s, n, tc.streams, tc.posts)
			}
		})
	}
}

// TestStreamForwarderConcurrent: questions in flight at once, all with the
// same DNS ID and answered out of order, each get their own answer back
// under their own ID.
func TestStreamForwarderConcurrent(t *testing.T) {
	p := startStreamPeer(t, &streamPeer{})
	f := &StreamForwarder{Dial: p.dial}
	t.Cleanup(func() { f.Close() })
	var wg sync.WaitGroup
	for i := range 100 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name := mdns.Fqdn(string(rune('a'+i%26)) + ".example")
			q := new(mdns.Msg).SetQuestion(name, mdns.TypeA)
			q.Id = 9
			raw, _ := q.Pack()
			out, err := f.Forward(context.Background(), raw)
			if err != nil {
				t.Error(err)
				return
			}
			m := new(mdns.Msg)
			if err := m.Unpack(out); err != nil || m.Id != 9 || m.Question[0].Name != name {
				t.Errorf("answer %v (err %v), want ID 9 for %s", m.Question, err, name)
			}
		}()
	}
	wg.Wait()
	if n := p.streams.Load(); n > DefaultStreamConns {
		t.Errorf("%d streams, want at most %d", n, DefaultStreamConns)
	}
}

// TestStreamForwarderClose: a closed forwarder refuses, and its streams'
// connections are closed.
func TestStreamForwarderClose(t *testing.T) {
	p := startStreamPeer(t, &streamPeer{})
	f := &StreamForwarder{Dial: p.dial, Conns: 1}
	st := &Stub{Forward: f.Forward}
	if m := askStub(t, st, "a.example", 1); m.Rcode != mdns.RcodeSuccess {
		t.Fatalf("before Close: %s", mdns.RcodeToString[m.Rcode])
	}
	f.Close()
	if m := askStub(t, st, "a.example", 2); m.Rcode != mdns.RcodeRefused {
		t.Errorf("after Close: %s, want REFUSED", mdns.RcodeToString[m.Rcode])
	}
	if n := p.streams.Load(); n != 1 {
		t.Errorf("%d streams, want 1", n)
	}
}

// FuzzStreamAnswers feeds a stream's reader arbitrary response bodies: it
// must never panic, hand a question anything shorter than a header, or
// keep a question waiting once the body has ended.
func FuzzStreamAnswers(f *testing.F) {
	a, _ := answerA(context.Background(), mustPack(query("a.example", mdns.TypeA)))
	f.Add(append(binary.BigEndian.AppendUint16(nil, uint16(len(a))), a...)) // one good answer for ID 0x1234
	f.Add([]byte{0, 3, 1, 2, 3})                                            // a frame shorter than a header
	f.Add([]byte{0xff, 0xff, 0x12, 0x34})                                   // a frame cut short
	f.Add([]byte{})                                                         // no answer at all
	q, _ := ParseQuery(mustPack(query("a.example", mdns.TypeA)))
	q.ID = 0x1235
	p := AppendAnswer(nil, &q, mdns.RcodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 60)
	f.Add(append(binary.BigEndian.AppendUint16(nil, uint16(len(p))), p...)) // a plain answer for the UDP question 0x1235
	// The UDP question's client: the fast path's socket and a client socket.
	spc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer spc.Close()
	client, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	defer client.Close()
	u := &udpServer{s: &Stub{}, pc: batchConn(spc)}
	udpQuery := mustPack(query("a.example", mdns.TypeA))
	f.Fuzz(func(t *testing.T, body []byte) {
		c1, c2 := net.Pipe()
		defer c2.Close()
		s := &stream{conn: c1, pending: map[uint16]waiter{}}
		ch := make(chan []byte, 1)
		s.pending[0x1234] = waiter{ch: ch}
		u.inflight.Store(1)
		s.pending[0x1235] = waiter{udp: &udpWait{srv: u, addr: client.LocalAddr(), query: udpQuery, max: mdns.MinMsgSize, sent: time.Now()}}
		s.read(&http.Response{Body: io.NopCloser(bytes.NewReader(body))})
		select {
		case ans, ok := <-ch:
			if ok && len(ans) < headerLen {
				t.Fatalf("answer of %d bytes", len(ans))
			}
		default:
			t.Fatal("the question still waits after the body ended")
		}
		// The UDP question got exactly one reply: its answer, checked,
		// or REFUSED.
		buf := make([]byte, 1024)
		_ = client.SetReadDeadline(time.Now().Add(2 * time.Second))
		n, _, err := client.ReadFrom(buf)
		if err != nil {
			t.Fatalf("no reply to the UDP question: %v", err)
		}
		m := new(mdns.Msg)
		if err := m.Unpack(buf[:n]); err != nil {
			t.Fatalf("UDP reply does not parse: %v", err)
		}
		req := new(mdns.Msg)
		_ = req.Unpack(udpQuery)
		if err := matches(req, m); err != nil || n > mdns.MinMsgSize {
			t.Fatalf("UDP reply of %d bytes does not match the question: %v", n, err)
		}
		if got := u.inflight.Load(); got != 0 {
			t.Fatalf("%d questions still counted in flight", got)
		}
		_ = client.SetReadDeadline(time.Now().Add(time.Millisecond))
		if _, _, err := client.ReadFrom(buf); err == nil {
			t.Fatal("a second reply to one UDP question")
		}
	})
}

func mustPack(m *mdns.Msg) []byte {
	b, err := m.Pack()
	if err != nil {
		panic(err)
	}
	return b
}
