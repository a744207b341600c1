package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAppendForArmsNoTimerWhenItWrites: a caller that finds nobody
// writing writes and fsyncs its own record, so its answer is there before
// it would wait: even a 1 ns bound never fails such a record. A bound
// armed before looking would lose about half of these selects to the
// already-fired timer.
func TestAppendForArmsNoTimerWhenItWrites(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path)
	must(t, err)
	defer l.Close()
	for i := range 200 {
		if _, err := l.AppendFor(rec(i), i%2 == 0, time.Nanosecond); err != nil {
			t.Fatalf("record %d: %v", i, err)
		}
	}
	if n, err := Verify(strings.NewReader(readString(t, path))); err != nil || n != 200 {
		t.Fatalf("Verify = %d, %v; want 200 records", n, err)
	}
}

// writeGated is a real file whose writes wait at a gate while it is shut.
type writeGated struct {
	*os.File
	shut    chan struct{} // closed: writes pass
	entered chan struct{}
}

func (f writeGated) WriteAt(p []byte, off int64) (int, error) {
	select {
	case <-f.shut:
	default:
		f.entered <- struct{}{}
		<-f.shut
	}
	return f.File.WriteAt(p, off)
}

// TestAppendForTimesOutWaitingForAnotherWriter: a record left to another
// writer (one whose write hangs) fails after the bound with
// context.DeadlineExceeded, and is still written once the writer goes on.
func TestAppendForTimesOutWaitingForAnotherWriter(t *testing.T) {
	g := writeGated{shut: make(chan struct{}), entered: make(chan struct{}, 4)}
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := open(path, Options{}, func(f *os.File) file { g.File = f; return g })
	must(t, err)
	defer l.Close()
	first := make(chan error, 1)
	go func() { _, err := l.AppendFor(rec(0), false, time.Minute); first <- err }()
	<-g.entered // rec 0's writer holds the writer's lock

	start := time.Now()
	_, err = l.AppendFor(rec(1), true, 50*time.Millisecond)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AppendFor behind a hung writer = %v, want context.DeadlineExceeded", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("AppendFor failed after %s, before its 50ms bound", waited)
	}
	close(g.shut)
	if err := <-first; err != nil {
		t.Fatalf("the first record: %v", err)
	}
	waitLines(t, path, 2) // "may still be written": it is
	if n, err := Verify(strings.NewReader(readString(t, path))); err != nil || n != 2 {
		t.Fatalf("Verify = %d, %v; want 2 records", n, err)
	}
}
