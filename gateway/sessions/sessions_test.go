package sessions

import (
	"sync/atomic"
	"testing"
)

type closer struct{ n *atomic.Int32 }

func (c closer) Close() error { c.n.Add(1); return nil }

// TestConnsCloseSession: ending a session closes exactly its connections,
// once each; a removed connection is not closed; a connection without a
// session is never registered.
func TestConnsCloseSession(t *testing.T) {
	var sc Conns
	var a1, a2, b, gone, none atomic.Int32
	sc.Add("a", closer{&a1})
	sc.Add("a", closer{&a2})
	sc.Add("b", closer{&b})
	remove := sc.Add("a", closer{&gone})
	remove()
	remove() // idempotent
	sc.Add("", closer{&none})
	if n := sc.Count("a"); n != 2 {
		t.Fatalf("session a has %d connections, want 2", n)
	}
	if n := sc.CloseSession("a"); n != 2 {
		t.Fatalf("CloseSession closed %d, want 2", n)
	}
	if a1.Load() != 1 || a2.Load() != 1 || b.Load() != 0 || gone.Load() != 0 || none.Load() != 0 {
		t.Fatalf("closed a1 %d a2 %d b %d removed %d sessionless %d; want 1 1 0 0 0", a1.Load(), a2.Load(), b.Load(), gone.Load(), none.Load())
	}
	if n := sc.Count("a") + sc.CloseSession("a"); n != 0 {
		t.Fatalf("an ended session still has %d connections", n)
	}
	if n := sc.Count("b"); n != 1 {
		t.Fatalf("session b has %d connections after a ended, want 1", n)
	}
}
