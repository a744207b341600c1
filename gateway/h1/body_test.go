package h1

import (
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// stallBody is a request body whose Read waits until released, as a
// read of a stalled client's body does until its deadline.
type stallBody struct{ release chan struct{} }

func (s stallBody) Read([]byte) (int, error) { <-s.release; return 0, io.ErrUnexpectedEOF }
func (s stallBody) Close() error             { return nil }

// TestBoundedBodyTimedOutWhileReadWaits: the HTTP/1 server cancels the
// request's context on a failed read before that Read returns, so a
// handler woken by the cancellation asks TimedOut while the Read is still
// on its way out. A Read waiting past its deadline must already count (it
// answered 502 instead of 408 in a loaded CI run before it did).
func TestBoundedBodyTimedOutWhileReadWaits(t *testing.T) {
	s := stallBody{make(chan struct{})}
	bb := Bound(s, http.NewResponseController(httptest.NewRecorder()), BodyLimit{Timeout: 50 * time.Millisecond})
	done := make(chan struct{})
	go func() { _, _ = bb.Read(make([]byte, 8)); close(done) }()
	time.Sleep(10 * time.Millisecond)
	if bb.TimedOut() {
		t.Fatal("TimedOut before the 50ms bound passed")
	}
	time.Sleep(100 * time.Millisecond)
	if !bb.TimedOut() {
		t.Error("a Read waiting past its 50ms deadline: TimedOut says false")
	}
	close(s.release)
	<-done
}
