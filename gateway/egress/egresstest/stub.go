package egresstest

import (
	"context"
	"net"
	"testing"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// StreamForwarder is the stub's transport to the sandbox socket sock as
// the relay dials it: a new connection with id's preamble per stream.
func StreamForwarder(sock string, id wire.Identity) *dns.StreamForwarder {
	return &dns.StreamForwarder{Dial: func(ctx context.Context) (net.Conn, error) {
		return wire.Dial(ctx, sock, id)
	}}
}

// StubAsk asks the real dns.Stub (forwarding, as the relay wires it, over
// a StreamForwarder) one question and returns the parsed answer, which
// must carry the question's ID.
func StubAsk(t *testing.T, st *dns.Stub, name string, qtype uint16) *mdns.Msg {
	t.Helper()
	q := new(mdns.Msg)
	q.SetQuestion(name, qtype)
	q.Id = 0x4242
	raw, err := q.Pack()
	if err != nil {
		t.Fatal(err)
	}
	out := st.Answer(context.Background(), raw, 0)
	m := new(mdns.Msg)
	if err := m.Unpack(out); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	if m.Id != 0x4242 {
		t.Fatalf("answer ID %#x, want the question's 0x4242", m.Id)
	}
	return m
}
