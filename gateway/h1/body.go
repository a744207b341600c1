package h1

import (
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"
)

// BodyLimit bounds how long a request body may take on the sandbox socket
// and inside an intercepted tunnel (THREATS B10), as Apache's
// mod_reqtimeout does: Timeout from the end of the head, extended by a
// second for every MinRate bytes that arrived. A
// body that stalls (slowloris on the body, not the head) is cut with 408
// request_timeout when its time is up while the server waits for its
// bytes; a handler that is slow to read is not the client's fault and
// never cuts it.
type BodyLimit struct {
	Timeout time.Duration // 0: no bound
	MinRate int64         // bytes per second that extend it; 0: none
}

// OverdueGrace is how long a Read of an overdue body waits for bytes.
const OverdueGrace = time.Second

// BoundedBody puts BodyLimit on a request body that does not pass the
// framing checker: an inner request of an intercepted tunnel, served by
// its own HTTP server over the tunnel's TLS (HTTP/1 or HTTP/2). Each Read
// gets the deadline the bound leaves, or OverdueGrace for bytes already
// sent if the bound passed while nobody read; the deadline is lifted at
// the body's end. TimedOut tells the caller why a read failed.
type BoundedBody struct {
	rc       io.ReadCloser
	ctl      *http.ResponseController
	lim      BodyLimit
	start    time.Time
	got      int64
	timedOut atomic.Bool
	// reading and deadline describe the Read in progress: the server
	// may cancel the request's context (HTTP/1 does, on a failed read)
	// before that Read returns, so a caller that sees the cancellation
	// first still learns that the bound passed.
	reading  atomic.Bool
	deadline atomic.Int64 // unix nanoseconds
}

// Bound returns rc, the body of the request ctl controls, under lim.
func Bound(rc io.ReadCloser, ctl *http.ResponseController, lim BodyLimit) *BoundedBody {
	return &BoundedBody{rc: rc, ctl: ctl, lim: lim}
}

// Limit is the bound the body is under.
func (b *BoundedBody) Limit() BodyLimit { return b.lim }

// TimedOut reports whether a Read failed because the bound passed, or is
// failing: a Read still waiting past its deadline counts.
func (b *BoundedBody) TimedOut() bool {
	if b.timedOut.Load() {
		return true
	}
	return b.reading.Load() && !time.Now().Before(time.Unix(0, b.deadline.Load()))
}

// Read reads from the body under the deadline the bound leaves.
func (b *BoundedBody) Read(p []byte) (int, error) {
	now := time.Now()
	if b.start.IsZero() {
		b.start = now
	}
	allowed := b.lim.Timeout
	if b.lim.MinRate > 0 {
		allowed += time.Duration(b.got / b.lim.MinRate * int64(time.Second))
	}
	dl := b.start.Add(allowed)
	if g := now.Add(OverdueGrace); dl.Before(g) && now.After(dl) {
		dl = g
	}
	_ = b.ctl.SetReadDeadline(dl)
	b.deadline.Store(dl.UnixNano())
	b.reading.Store(true)
	n, err := b.rc.Read(p)
	b.got += int64(n)
	if err != nil {
		_ = b.ctl.SetReadDeadline(time.Time{})
		var ne net.Error
		if errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &ne) && ne.Timeout() {
			b.timedOut.Store(true)
		}
	}
	b.reading.Store(false) // after timedOut: TimedOut never sees a gap
	return n, err
}

// Close lifts the deadline and closes the body.
func (b *BoundedBody) Close() error {
	_ = b.ctl.SetReadDeadline(time.Time{})
	return b.rc.Close()
}
