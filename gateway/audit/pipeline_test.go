package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// gatedFile is a real file whose fsyncs wait at a gate while it is shut,
// and fail while fail is set.
type gatedFile struct {
	*os.File
	shut    *atomic.Bool
	gate    chan struct{} // closed to let the waiting fsyncs through
	entered chan struct{} // one value per fsync that waits at the gate
	fail    *atomic.Bool
	once    *atomic.Bool // set: only the first fsync while shut waits
}

func (f gatedFile) Sync() error {
	if f.shut.Load() && (f.once == nil || f.once.CompareAndSwap(false, true)) {
		f.entered <- struct{}{}
		<-f.gate
	}
	if f.fail.Load() {
		return &os.PathError{Op: "sync", Path: f.Name(), Err: syscall.EIO}
	}
	return f.File.Sync()
}

func openGated(t *testing.T) (*Log, string, gatedFile) {
	t.Helper()
	g := gatedFile{shut: new(atomic.Bool), gate: make(chan struct{}), entered: make(chan struct{}, 64), fail: new(atomic.Bool)}
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := open(path, Options{}, func(f *os.File) file { g.File = f; return g })
	must(t, err)
	t.Cleanup(func() { l.Close() })
	return l, path, g
}

func lines(t *testing.T, path string) int {
	t.Helper()
	return strings.Count(readString(t, path), "\n")
}

// waitLines waits until the file holds n lines.
func waitLines(t *testing.T, path string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for lines(t, path) < n {
		if time.Now().After(deadline) {
			t.Fatalf("the file holds %d lines after 10s, want %d: a write waited for an fsync", lines(t, path), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestWritesDoNotWaitForAnFsync: while one call's fsync runs, another
// call's decision record (AppendWritten) is written and answered, and the
// records of 7 more callers are written; one fsync then covers all 7.
// Each Append still returns only after an fsync that began after its
// record was written.
func TestWritesDoNotWaitForAnFsync(t *testing.T) {
	l, path, g := openGated(t)
	ctx := context.Background()
	g.shut.Store(true)
	first := make(chan error, 1)
	go func() { _, err := l.Append(ctx, rec(0)); first <- err }()
	<-g.entered // rec 0's fsync runs (and waits)

	done := make(chan error, 1)
	go func() { _, err := l.AppendWritten(ctx, rec(1)); done <- err }()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("AppendWritten waited for another record's fsync")
	}
	if !strings.Contains(readString(t, path), `"request_id":"req-1"`) {
		t.Fatal("AppendWritten returned before its record was in the file")
	}

	var wg sync.WaitGroup
	var answered atomic.Int32
	errs := make(chan error, 7)
	for i := range 7 {
		wg.Go(func() {
			_, err := l.Append(ctx, rec(2+i))
			answered.Add(1)
			errs <- err
		})
	}
	waitLines(t, path, 9)
	select {
	case err := <-first:
		t.Fatalf("Append returned (%v) before its fsync did", err)
	default:
	}
	if n := answered.Load(); n != 0 {
		t.Fatalf("%d Appends returned before any fsync covering them", n)
	}
	g.shut.Store(false)
	close(g.gate)
	must(t, <-first)
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
	if s := l.Stats(); s.Syncs != 2 || s.Records != 9 {
		t.Fatalf("Stats = %+v, want 9 records in 2 fsyncs: one while the others were written, one for all 7 written meanwhile", s)
	}
	must(t, l.Close())
	if n := verifyFile(t, path); n != 9 {
		t.Fatalf("Verify = %d, want 9", n)
	}
}

// failAfterAnsweredWrite leaves a log whose last fsync failed after a
// record was answered as written (returned): rec 0 fsynced, rec 1
// written, rec 2's Append failed with EIO. Fsyncs fail until g.fail is
// cleared.
func failAfterAnsweredWrite(t *testing.T) (*Log, string, gatedFile, Record) {
	t.Helper()
	l, path, g := openGated(t)
	ctx := context.Background()
	appendN(t, l, 1)
	w, err := l.AppendWritten(ctx, rec(1))
	must(t, err)
	g.fail.Store(true)
	if _, err := l.Append(ctx, rec(2)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Append with a failing fsync = %v, want EIO", err)
	}
	return l, path, g, w
}

// TestFsyncFailureKeepsAnsweredWrites: a record answered as written
// (AppendWritten: its call went on to the upstream) is never taken out of
// the log by a later failed fsync. The Append whose fsync failed fails, the
// log refuses until the records are written again and fsynced, and the
// chain keeps every record in order.
func TestFsyncFailureKeepsAnsweredWrites(t *testing.T) {
	l, path, g, w := failAfterAnsweredWrite(t)
	ctx := context.Background()
	if _, err := l.AppendWritten(ctx, rec(3)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("AppendWritten in the failed state = %v, want EIO: the unsynced records must be rewritten and fsynced first", err)
	}
	g.fail.Store(false)
	r, err := l.Append(ctx, rec(4))
	must(t, err)
	if r.Seq != 4 {
		t.Fatalf("seq after recovery = %d, want 4 (records 1..3 kept: 2 was written after the answered %d)", r.Seq, w.Seq)
	}
	must(t, l.Close())
	if n := verifyFile(t, path); n != 4 {
		t.Fatalf("Verify = %d, want 4", n)
	}
	if !strings.Contains(readString(t, path), `"hash":"`+w.Hash+`"`) {
		t.Fatal("the record answered as written is gone from the log")
	}
}

// TestCallPairsNeverStall runs the gateway's pattern (a written decision,
// then a durable result) from 8 callers many times over: every record that
// waits for the writer's lock must be written by whoever lets it go,
// including the fsync's own short holds of it. A record left behind shows
// as an Append that runs into its deadline.
func TestCallPairsNeverStall(t *testing.T) {
	dir := t.TempDir()
	if d, err := os.MkdirTemp("/dev/shm", "audit-pairs-"); err == nil {
		t.Cleanup(func() { os.RemoveAll(d) })
		dir = d
	}
	path := filepath.Join(dir, "audit.log")
	l, err := Open(path)
	must(t, err)
	defer l.Close()
	const callers, calls = 8, 400
	var wg sync.WaitGroup
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			for range calls {
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				_, err := l.AppendWritten(ctx, rec(1))
				if err == nil {
					_, err = l.Append(ctx, rec(2))
				}
				cancel()
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("a call's record was not answered: %v", err)
	}
	must(t, l.Close())
	if n := verifyFile(t, path); n != 2*callers*calls {
		t.Fatalf("Verify = %d, want %d", n, 2*callers*calls)
	}
}

// TestRecordLeftDuringAnFsyncIsWritten: a record whose caller finds the
// writer's lock held by the fsync's bookkeeping (not by a writer) is
// left to whoever holds the lock, which must see it written when it lets
// go. Found as a stall under 8 callers in BenchmarkCallPairs.
func TestRecordLeftDuringAnFsyncIsWritten(t *testing.T) {
	l, _, _ := openGated(t)
	ctx := context.Background()
	held, let := make(chan struct{}), make(chan struct{})
	var once sync.Once
	l.syncedHook = func() { once.Do(func() { close(held); <-let }) }
	first := make(chan error, 1)
	go func() { _, err := l.Append(ctx, rec(0)); first <- err }()
	<-held // rec 0 is fsynced; its bookkeeping holds the writer's lock
	second := make(chan error, 1)
	go func() { _, err := l.Append(ctx, rec(1)); second <- err }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		l.mu.Lock()
		n := len(l.pending)
		l.mu.Unlock()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("rec 1 was never queued")
		}
		time.Sleep(time.Millisecond)
	}
	close(let)
	must(t, <-first)
	select {
	case err := <-second:
		must(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the record left while the fsync's bookkeeping held the lock was never written")
	}
}

// TestConcurrentFsyncFailureTakesBackBoth: an fsync fails (at a rotation)
// while an earlier one is still running. The records it takes back
// include the earlier fsync's: that fsync's caller fails too, even though
// its own fsync returned success, and the rotated file ends at the last
// good fsync, so the new file's chain does not fork from it.
func TestConcurrentFsyncFailureTakesBackBoth(t *testing.T) {
	g := gatedFile{shut: new(atomic.Bool), gate: make(chan struct{}), entered: make(chan struct{}, 64), fail: new(atomic.Bool), once: new(atomic.Bool)}
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := open(path, Options{}, func(f *os.File) file { g.File = f; return g })
	must(t, err)
	defer l.Close()
	ctx := context.Background()
	appendN(t, l, 1)
	g.shut.Store(true)
	first := make(chan error, 1)
	go func() { _, err := l.Append(ctx, rec(1)); first <- err }()
	<-g.entered // rec 1's fsync runs (and waits)
	g.fail.Store(true)
	must(t, os.Rename(path, path+".1"))
	if _, err := l.Append(ctx, rec(2)); !errors.Is(err, syscall.EIO) {
		t.Fatalf("Append whose rotation fsync fails = %v, want EIO", err)
	}
	g.fail.Store(false)
	close(g.gate)
	if err := <-first; err == nil {
		t.Fatal("Append answered although a concurrent fsync failure took its record back")
	}
	r, err := l.Append(ctx, rec(3))
	must(t, err)
	if r.Seq != 3 { // 1: rec 0; 2: the new file's marker; 3: rec 3
		t.Fatalf("seq after recovery = %d, want 3", r.Seq)
	}
	must(t, l.Close())
	old, err := os.Open(path + ".1")
	must(t, err)
	defer old.Close()
	if n, err := Verify(old); err != nil || n != 1 {
		t.Fatalf("rotated file: Verify = %d, %v; want only the fsynced record", n, err)
	}
}

// TestCloseRewritesAfterAFailedFsync: a log closed in the failed state
// that kept its records (TestFsyncFailureKeepsAnsweredWrites) writes them
// again and fsyncs them: after a failed fsync another fsync alone proves
// nothing about the pages it reported lost.
func TestCloseRewritesAfterAFailedFsync(t *testing.T) {
	l, path, g, _ := failAfterAnsweredWrite(t)
	g.fail.Store(false)
	syncs := l.Stats().Syncs
	must(t, l.Close())
	if s := l.Stats(); s.Syncs != syncs+1 {
		t.Fatalf("Close made %d fsyncs, want the one after the rewrite", s.Syncs-syncs)
	}
	if n := verifyFile(t, path); n != 3 {
		t.Fatalf("Verify = %d, want 3 (the answered record and the failed Append's, kept)", n)
	}
}
