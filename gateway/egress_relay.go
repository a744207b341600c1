package gateway

import (
	"io"
	"sync/atomic"
	"time"
)

// The pieces every byte relay of raw egress shares: a CONNECT tunnel
// (splice, relayTCP) and a switched WebSocket (relayWebSocket) each copy
// both ways, note when a byte last moved, and are cut by one watchdog when
// nothing has moved for the idle timeout (one timer per relay rather than
// a deadline update per read).

// activity is when a relay last moved a byte, either way.
type activity struct{ last atomic.Int64 }

func newActivity() *activity {
	a := &activity{}
	a.touch()
	return a
}

func (a *activity) touch() { a.last.Store(time.Now().UnixNano()) }

// idleFor reports whether nothing has moved for d.
func (a *activity) idleFor(d time.Duration) bool {
	return time.Since(time.Unix(0, a.last.Load())) >= d
}

// awaitRelay returns once both directions of a relay have sent on done.
// Every quarter of idle it asks stalled, and calls cut when that says
// nothing has moved for idle; cut must make both directions end. With
// cutOnEnd, the first direction to end cuts the other too.
func awaitRelay(done <-chan struct{}, idle time.Duration, stalled func() bool, cut func(), cutOnEnd bool) {
	tick := time.NewTicker(max(idle/4, time.Millisecond))
	defer tick.Stop()
	for finished := 0; finished < 2; {
		select {
		case <-done:
			finished++
			if cutOnEnd {
				cut()
			}
		case <-tick.C:
			if stalled() {
				cut()
			}
		}
	}
}

// copyCounted copies src to dst, adding what it wrote to n and calling
// touch on every read that moved bytes. It returns at src's end (nil) or
// the first read or write error.
func copyCounted(dst io.Writer, src io.Reader, n *atomic.Int64, touch func()) (int64, error) {
	buf := make([]byte, 32<<10)
	var total int64
	for {
		k, err := src.Read(buf)
		if k > 0 {
			touch()
			m, werr := dst.Write(buf[:k])
			total += int64(m)
			n.Add(int64(m))
			if werr != nil {
				return total, werr
			}
		}
		if err != nil {
			if err == io.EOF {
				return total, nil
			}
			return total, err
		}
	}
}
