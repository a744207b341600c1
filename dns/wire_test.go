package dns

import (
	"bytes"
	"context"
	"net/netip"
	"strings"
	"testing"

	mdns "github.com/miekg/dns"
)

func TestParseQuery(t *testing.T) {
	plain := mustPack(query("Pkg.Example", mdns.TypeA))
	edns := query("pkg.example", mdns.TypeA).SetEdns0(4096, false)
	multi := query("a.example", mdns.TypeA)
	multi.Question = append(multi.Question, multi.Question[0])
	withAnswer := query("a.example", mdns.TypeA)
	rr, _ := mdns.NewRR("a.example. 60 IN A 192.0.2.1")
	withAnswer.Answer = []mdns.RR{rr}
	notify := query("a.example", mdns.TypeSOA)
	notify.Opcode = mdns.OpcodeNotify
	label64 := "x" + strings.Repeat("a", 63) + ".example"
	tests := []struct {
		name string
		msg  []byte
		ok   bool
	}{
		{"plain A, mixed case", plain, true},
		{"underscore and hyphen", mustPack(query("_dmarc.my-host.example", mdns.TypeAAAA)), true},
		{"EDNS takes the full parse", mustPack(edns), false},
		{"two questions (RFC 9619)", mustPack(multi), false},
		{"a record in the answer section", mustPack(withAnswer), false},
		{"opcode NOTIFY", mustPack(notify), false},
		{"a response", append(append([]byte(nil), plain[:2]...), append([]byte{plain[2] | 0x80}, plain[3:]...)...), false},
		{"a byte after the question", append(append([]byte(nil), plain...), 0), false},
		{"a question cut short", plain[:len(plain)-1], false},
		// 0xc0 0x0c points at the name itself.
		{"compression pointer", []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}, false},
		{"root name", []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1}, false},
		// 0x40 is a reserved label type (RFC 6891 removed extended labels).
		{"label type 0x40", []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x40, 'a', 0, 0, 1, 0, 1}, false},
		{"label of 64 bytes", rawQuery(label64), false},
		{"name over 255 octets (THREATS C9)", longName(), false},
		{"a space in a label", rawQuery("a b.example"), false},
		{"a wildcard label", rawQuery("*.example"), false},
		{"an empty label", []byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 'a', 0, 0, 0, 1, 0, 1}, false},
		{"shorter than a header", plain[:11], false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			q, ok := ParseQuery(tt.msg)
			if ok != tt.ok {
				t.Fatalf("ParseQuery ok = %v, want %v", ok, tt.ok)
			}
			if ok {
				checkAgainstMiekg(t, tt.msg, q)
			}
		})
	}
}

// rawQuery packs a query for name by hand (miekg refuses some of the
// names these cases need).
func rawQuery(name string) []byte {
	b := []byte{0xab, 0xcd, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, l := range strings.Split(name, ".") {
		b = append(b, byte(len(l)))
		b = append(b, l...)
	}
	return append(b, 0, 0, 1, 0, 1)
}

// checkAgainstMiekg asserts that miekg parses msg to the question q says,
// and packs it back to the very same bytes (so the fast path forwards the
// canonical copy the full parse would).
func checkAgainstMiekg(t *testing.T, msg []byte, q Question) {
	t.Helper()
	m := new(mdns.Msg)
	if err := m.Unpack(msg); err != nil {
		t.Fatalf("ParseQuery accepted what miekg does not parse: %v", err)
	}
	if m.Response || m.Opcode != mdns.OpcodeQuery || len(m.Question) != 1 || len(m.Answer)+len(m.Ns)+len(m.Extra) != 0 {
		t.Fatalf("ParseQuery accepted %v", m)
	}
	mq := m.Question[0]
	name := string(AppendName(nil, q.Name))
	if m.Id != q.ID || strings.ToLower(mq.Name) != name+"." || mq.Qtype != q.Type || mq.Qclass != q.Class {
		t.Fatalf("ParseQuery: id %d %q %d %d; miekg: id %d %q %d %d", q.ID, name, q.Type, q.Class, m.Id, mq.Name, mq.Qtype, mq.Qclass)
	}
	if q.RD() != m.RecursionDesired {
		t.Fatalf("RD %v, miekg %v", q.RD(), m.RecursionDesired)
	}
	again, err := m.Pack()
	if err != nil || !bytes.Equal(again, msg) {
		t.Fatalf("miekg repacks %x as %x (%v)", msg, again, err)
	}
}

// FuzzParseQuery: whatever the fast path's parser accepts, miekg parses to
// the same question and repacks to the same bytes.
func FuzzParseQuery(f *testing.F) {
	f.Add(mustPack(query("a.example", mdns.TypeA)))                         // plain
	f.Add(mustPack(query("A-b_C.Example", mdns.TypeAAAA)))                  // mixed case, '-' and '_'
	f.Add(mustPack(query("a.example", mdns.TypeA).SetEdns0(4096, true)))    // EDNS
	f.Add([]byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}) // pointer to itself
	f.Add(longName())                                                       // over 255 octets
	f.Fuzz(func(t *testing.T, msg []byte) {
		if q, ok := ParseQuery(msg); ok {
			checkAgainstMiekg(t, msg, q)
		}
	})
}

func TestAppendAnswer(t *testing.T) {
	req := query("Pkg.EXAMPLE", mdns.TypeA)
	req.CheckingDisabled = true
	raw := mustPack(req)
	q, ok := ParseQuery(raw)
	if !ok {
		t.Fatal("ParseQuery refused a plain query")
	}
	addrs := []netip.Addr{netip.MustParseAddr("192.0.2.1"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("192.0.2.2")}
	out := AppendAnswer(nil, &q, mdns.RcodeSuccess, addrs, 42)
	m := new(mdns.Msg)
	if err := m.Unpack(out); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	if err := matches(req, m); err != nil {
		t.Fatal(err)
	}
	if m.Id != req.Id || !m.RecursionDesired || !m.CheckingDisabled || !m.RecursionAvailable || m.Authoritative || m.Rcode != mdns.RcodeSuccess {
		t.Errorf("header %+v", m.MsgHdr)
	}
	if m.Question[0].Name != "Pkg.EXAMPLE." {
		t.Errorf("question %q, want the case as asked (0x20)", m.Question[0].Name)
	}
	if len(m.Answer) != 2 {
		t.Fatalf("%d records, want the 2 IPv4 ones", len(m.Answer))
	}
	for i, want := range []string{"192.0.2.1", "192.0.2.2"} {
		a, ok := m.Answer[i].(*mdns.A)
		if !ok || a.A.String() != want || a.Hdr.Ttl != 42 || a.Hdr.Name != "Pkg.EXAMPLE." || a.Hdr.Class != mdns.ClassINET {
			t.Errorf("record %d = %v, want %s with TTL 42", i, m.Answer[i], want)
		}
	}
	if !plainAnswer(out, raw[headerLen:]) {
		t.Error("plainAnswer refuses AppendAnswer's own shape")
	}
}

func TestPlainAnswer(t *testing.T) {
	req := query("pkg.example", mdns.TypeA)
	raw := mustPack(req)
	q, _ := ParseQuery(raw)
	good := AppendAnswer(nil, &q, mdns.RcodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 60)
	mutate := func(f func(b []byte) []byte) []byte { return f(append([]byte(nil), good...)) }
	upper := mustPack(query("PKG.example", mdns.TypeA))
	uq, _ := ParseQuery(upper)
	tests := []struct {
		name string
		ans  []byte
		want bool
	}{
		{"AppendAnswer's shape", good, true},
		{"question in another case (RFC 4343)", AppendAnswer(nil, &uq, mdns.RcodeSuccess, nil, 0), true},
		{"REFUSED, no records", AppendAnswer(nil, &q, mdns.RcodeRefused, nil, 0), true},
		{"not a response", mutate(func(b []byte) []byte { b[2] &^= 0x80; return b }), false},
		{"another name", mutate(func(b []byte) []byte { b[headerLen+1] = 'x'; return b }), false},
		{"another type in the question", mutate(func(b []byte) []byte { b[headerLen+len(q.Name)+1] = 28; return b }), false},
		{"record count beyond the data", mutate(func(b []byte) []byte { b[7] = 2; return b }), false},
		{"trailing byte", append(append([]byte(nil), good...), 0), false},
		{"owner not a pointer to the question", mutate(func(b []byte) []byte { b[headerLen+len(q.Name)+5] = 0xc1; return b }), false},
		{"A data of 5 bytes", mutate(func(b []byte) []byte { b[len(b)-5] = 5; return append(b, 0) }), false},
		{"an additional record", mutate(func(b []byte) []byte { b[11] = 1; return b }), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := plainAnswer(tt.ans, raw[headerLen:]); got != tt.want {
				t.Errorf("plainAnswer = %v, want %v", got, tt.want)
			}
		})
	}
}

// FuzzPlainAnswer: any answer plainAnswer lets through parses with miekg
// and matches the query as the full check (matches) demands.
func FuzzPlainAnswer(f *testing.F) {
	req := query("pkg.example", mdns.TypeA)
	raw := mustPack(req)
	q, _ := ParseQuery(raw)
	f.Add(AppendAnswer(nil, &q, mdns.RcodeSuccess, []netip.Addr{netip.MustParseAddr("192.0.2.1")}, 60)) // one A record
	f.Add(AppendAnswer(nil, &q, mdns.RcodeRefused, nil, 0))                                             // REFUSED
	a, _ := answerA(context.Background(), raw)
	f.Add(a) // miekg's uncompressed shape (refused by plainAnswer)
	f.Fuzz(func(t *testing.T, ans []byte) {
		if !plainAnswer(ans, raw[headerLen:]) {
			return
		}
		m := new(mdns.Msg)
		if err := m.Unpack(ans); err != nil {
			t.Fatalf("plainAnswer accepted what miekg does not parse: %v", err)
		}
		m.Id = req.Id
		if err := matches(req, m); err != nil {
			t.Fatalf("plainAnswer accepted a mismatch: %v", err)
		}
	})
}
