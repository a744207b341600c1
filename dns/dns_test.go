package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

// answerA is a Forward that answers every A question with 192.0.2.1 (a
// documentation address: nothing dials it).
func answerA(_ context.Context, query []byte) ([]byte, error) {
	req := new(mdns.Msg)
	if err := req.Unpack(query); err != nil {
		return nil, err
	}
	resp := new(mdns.Msg).SetReply(req)
	rr, err := mdns.NewRR(req.Question[0].Name + " 60 IN A 192.0.2.1")
	if err != nil {
		return nil, err
	}
	resp.Answer = append(resp.Answer, rr)
	return resp.Pack()
}

// startStub serves st on loopback UDP and TCP and returns both addresses.
func startStub(t *testing.T, st *Stub) (udp, tcp string) {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 2)
	go func() { done <- st.ServeUDP(pc) }()
	go func() { done <- st.ServeTCP(l) }()
	t.Cleanup(func() {
		pc.Close()
		l.Close()
		for range 2 {
			if err := <-done; err != nil {
				t.Errorf("serve returned %v, want nil after close", err)
			}
		}
	})
	return pc.LocalAddr().String(), l.Addr().String()
}

func query(name string, qtype uint16) *mdns.Msg {
	m := new(mdns.Msg).SetQuestion(mdns.Fqdn(name), qtype)
	m.Id = 0x1234
	return m
}

func TestStub(t *testing.T) {
	wrongID := func(ctx context.Context, q []byte) ([]byte, error) {
		b, err := answerA(ctx, q)
		if err == nil {
			b[0] ^= 0xff
		}
		return b, err
	}
	wrongName := func(_ context.Context, q []byte) ([]byte, error) {
		req := new(mdns.Msg)
		req.Unpack(q)
		resp := new(mdns.Msg).SetReply(req)
		resp.Question[0].Name = "other.example."
		return resp.Pack()
	}
	multi := query("a.example", mdns.TypeA)
	multi.Question = append(multi.Question, mdns.Question{Name: "b.example.", Qtype: mdns.TypeA, Qclass: mdns.ClassINET})
	notify := query("a.example", mdns.TypeSOA)
	notify.Opcode = mdns.OpcodeNotify

	tests := []struct {
		name      string
		forward   func(context.Context, []byte) ([]byte, error)
		msg       *mdns.Msg
		rcode     int
		answers   int
		forwarded bool // whether the query may reach Forward at all
	}{
		{"forwarded answer", answerA, query("a.example", mdns.TypeA), mdns.RcodeSuccess, 1, true},
		{"forward error is REFUSED (gateway 404 before egress issue)", func(context.Context, []byte) ([]byte, error) {
			return nil, errors.New("gateway: 404")
		}, query("a.example", mdns.TypeA), mdns.RcodeRefused, 0, true},
		{"no forwarder is REFUSED", nil, query("a.example", mdns.TypeA), mdns.RcodeRefused, 0, false},
		{"garbage answer is REFUSED", func(context.Context, []byte) ([]byte, error) {
			return []byte{1, 2, 3}, nil
		}, query("a.example", mdns.TypeA), mdns.RcodeRefused, 0, true},
		{"answer with other ID is REFUSED", wrongID, query("a.example", mdns.TypeA), mdns.RcodeRefused, 0, true},
		{"answer to other question is REFUSED", wrongName, query("a.example", mdns.TypeA), mdns.RcodeRefused, 0, true},
		{"multi-question is FORMERR (RFC 9619, THREATS C7)", answerA, multi, mdns.RcodeFormatError, 0, false},
		{"NOTIFY opcode is NOTIMP", answerA, notify, mdns.RcodeNotImplemented, 0, false},
		{"TXT is NOTIMP (THREATS C7)", answerA, query("a.example", mdns.TypeTXT), mdns.RcodeNotImplemented, 0, false},
		{"NULL is NOTIMP (THREATS C7)", answerA, query("a.example", mdns.TypeNULL), mdns.RcodeNotImplemented, 0, false},
		{"ANY is NOTIMP (THREATS C7, RFC 8482)", answerA, query("a.example", mdns.TypeANY), mdns.RcodeNotImplemented, 0, false},
		{"AXFR is NOTIMP", answerA, query("a.example", mdns.TypeAXFR), mdns.RcodeNotImplemented, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var calls atomic.Int32
			st := &Stub{Timeout: time.Second}
			if tt.forward != nil {
				st.Forward = func(ctx context.Context, q []byte) ([]byte, error) {
					calls.Add(1)
					return tt.forward(ctx, q)
				}
			}
			udp, tcp := startStub(t, st)
			for _, nw := range []struct{ net, addr string }{{"udp", udp}, {"tcp", tcp}} {
				c := &mdns.Client{Net: nw.net, Timeout: 2 * time.Second}
				resp, _, err := c.Exchange(tt.msg.Copy(), nw.addr)
				if err != nil {
					t.Fatalf("%s exchange: %v", nw.net, err)
				}
				if resp.Id != tt.msg.Id {
					t.Errorf("%s: id %d, want %d", nw.net, resp.Id, tt.msg.Id)
				}
				if resp.Rcode != tt.rcode {
					t.Errorf("%s: rcode %s, want %s", nw.net, mdns.RcodeToString[resp.Rcode], mdns.RcodeToString[tt.rcode])
				}
				if len(resp.Answer) != tt.answers {
					t.Errorf("%s: %d answers, want %d", nw.net, len(resp.Answer), tt.answers)
				}
			}
			if n := calls.Load(); !tt.forwarded && n != 0 {
				t.Errorf("Forward called %d times, want 0 (answered by the stub)", n)
			} else if tt.forwarded && n != 2 {
				t.Errorf("Forward called %d times, want 2 (udp and tcp)", n)
			}
		})
	}
}

func TestStubRaw(t *testing.T) {
	udp, _ := startStub(t, &Stub{Forward: answerA})
	tests := []struct {
		name  string
		raw   []byte
		rcode int // -1: no answer expected
	}{
		// A header that claims one question but carries none.
		{"truncated question is FORMERR", []byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}, mdns.RcodeFormatError},
		// A label length of 0x40 is neither a label (<64) nor a pointer.
		{"bad label type is FORMERR", []byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0, 0x40, 'a', 0, 0, 1, 0, 1}, mdns.RcodeFormatError},
		// Five 63-byte labels: 321 octets, over the 255 of RFC 1035 2.3.4 (THREATS C9).
		{"name over 255 octets is FORMERR", longName(), mdns.RcodeFormatError},
		{"shorter than a header is dropped", []byte{0xab, 0xcd, 0x01}, -1},
		{"a response is never answered", []byte{0xab, 0xcd, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0}, -1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := net.Dial("udp", udp)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if _, err := c.Write(tt.raw); err != nil {
				t.Fatal(err)
			}
			wait := 2 * time.Second
			if tt.rcode < 0 {
				wait = 300 * time.Millisecond
			}
			c.SetReadDeadline(time.Now().Add(wait))
			buf := make([]byte, 512)
			n, err := c.Read(buf)
			if tt.rcode < 0 {
				var ne net.Error
				if !errors.As(err, &ne) || !ne.Timeout() {
					t.Fatalf("read = %d bytes, %v; want no answer (timeout)", n, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			resp := new(mdns.Msg)
			if err := resp.Unpack(buf[:n]); err != nil {
				t.Fatal(err)
			}
			if resp.Id != 0xabcd || resp.Rcode != tt.rcode || !resp.Response {
				t.Errorf("got id %#x rcode %s qr %v, want id 0xabcd rcode %s qr true", resp.Id, mdns.RcodeToString[resp.Rcode], resp.Response, mdns.RcodeToString[tt.rcode])
			}
		})
	}
}

func longName() []byte {
	b := []byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	for range 5 {
		b = append(b, 63)
		for range 63 {
			b = append(b, 'a')
		}
	}
	return append(b, 0, 0, 1, 0, 1)
}

func TestStubTruncatesUDP(t *testing.T) {
	many := func(_ context.Context, q []byte) ([]byte, error) {
		req := new(mdns.Msg)
		req.Unpack(q)
		resp := new(mdns.Msg).SetReply(req)
		for i := range 60 {
			rr, _ := mdns.NewRR(fmt.Sprintf("%s 60 IN AAAA 2001:db8::%x", req.Question[0].Name, i+1))
			resp.Answer = append(resp.Answer, rr)
		}
		return resp.Pack()
	}
	udp, tcp := startStub(t, &Stub{Forward: many})
	tests := []struct {
		name      string
		net, addr string
		truncated bool
	}{
		{"udp without EDNS is cut at 512 bytes with TC (RFC 1035 4.2.1)", "udp", udp, true},
		{"tcp carries the whole answer", "tcp", tcp, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &mdns.Client{Net: tt.net, Timeout: 2 * time.Second, UDPSize: 512}
			resp, _, err := c.Exchange(query("big.example", mdns.TypeAAAA), tt.addr)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Truncated != tt.truncated {
				t.Errorf("TC = %v, want %v", resp.Truncated, tt.truncated)
			}
			if !tt.truncated && len(resp.Answer) != 60 {
				t.Errorf("%d answers, want 60", len(resp.Answer))
			}
		})
	}
}

func TestStubTCPConnCap(t *testing.T) {
	_, tcp := startStub(t, &Stub{Forward: answerA, MaxTCPConns: 1, TCPIdle: 5 * time.Second})
	first, err := net.Dial("tcp", tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	// Make sure the first connection holds the only slot.
	c1 := &mdns.Conn{Conn: first}
	if err := c1.WriteMsg(query("a.example", mdns.TypeA)); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.ReadMsg(); err != nil {
		t.Fatalf("first connection: %v", err)
	}
	second, err := net.Dial("tcp", tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer second.Close()
	second.SetReadDeadline(time.Now().Add(2 * time.Second))
	if n, err := second.Read(make([]byte, 1)); err == nil {
		t.Fatalf("second connection read %d bytes, want it closed beyond the cap", n)
	} else {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("second connection still open beyond the cap")
		}
	}
}

func FuzzStub(f *testing.F) {
	seed := func(m *mdns.Msg) []byte {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	// A plain A query.
	f.Add(seed(query("a.example", mdns.TypeA)))
	// A query with an EDNS0 OPT record asking for 4096-byte answers.
	f.Add(seed(query("a.example", mdns.TypeAAAA).SetEdns0(4096, true)))
	// Two questions (FORMERR).
	multi := query("a.example", mdns.TypeA)
	multi.Question = append(multi.Question, multi.Question[0])
	f.Add(seed(multi))
	// A header promising a question that is not there.
	f.Add([]byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0})
	// A compression pointer to itself.
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1})
	// A response (never answered).
	f.Add([]byte{0xab, 0xcd, 0x81, 0x80, 0, 0, 0, 0, 0, 0, 0, 0})
	st := &Stub{Forward: answerA}
	f.Fuzz(func(t *testing.T, q []byte) {
		for _, size := range []int{512, 0} {
			b := st.Answer(context.Background(), q, size)
			if b == nil {
				continue
			}
			resp := new(mdns.Msg)
			if err := resp.Unpack(b); err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if !resp.Response {
				t.Fatal("reply without QR")
			}
			if len(q) >= 2 && resp.Id != uint16(q[0])<<8|uint16(q[1]) {
				t.Fatalf("reply id %d does not match query", resp.Id)
			}
			if size > 0 && len(b) > 65535 {
				t.Fatalf("reply of %d bytes", len(b))
			}
			if size == 512 && len(b) > 512 && resp.IsEdns0() == nil {
				t.Fatalf("udp reply of %d bytes without EDNS", len(b))
			}
		}
	})
}

// BenchmarkStubUDP is one A query over loopback UDP, answered by an
// in-process Forward (the stub's own cost plus two parses and packs).
func BenchmarkStubUDP(b *testing.B) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	st := &Stub{Forward: answerA}
	done := make(chan error, 1)
	go func() { done <- st.ServeUDP(pc) }()
	defer func() { pc.Close(); <-done }()
	c, err := net.Dial("udp", pc.LocalAddr().String())
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	conn := &mdns.Conn{Conn: c}
	q := query("a.example", mdns.TypeA)
	for b.Loop() {
		if err := conn.WriteMsg(q); err != nil {
			b.Fatal(err)
		}
		if _, err := conn.ReadMsg(); err != nil {
			b.Fatal(err)
		}
	}
}
