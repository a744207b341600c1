package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// syncModes are the modes every table below runs in. The long interval
// keeps the background fsync out of the way of what a case counts.
var syncModes = []struct {
	name string
	opts Options
}{
	{"always", Options{}},
	{"interval", Options{Sync: SyncInterval, SyncInterval: time.Hour}},
}

func openFault(t *testing.T, o Options) (*Log, string, *atomic.Bool, *atomic.Bool) {
	t.Helper()
	var failWrite, failSync atomic.Bool
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := open(path, o, func(f *os.File) file { return faultFile{f, &failWrite, &failSync} })
	must(t, err)
	t.Cleanup(func() { l.Close() })
	return l, path, &failWrite, &failSync
}

func TestSyncModeAppendWritesBeforeReturning(t *testing.T) {
	for _, m := range syncModes {
		t.Run(m.name, func(t *testing.T) {
			l, path, _, _ := openFault(t, m.opts)
			for i := range 3 {
				r, err := l.Append(context.Background(), rec(i))
				if err != nil {
					t.Fatalf("Append %d: %v", i, err)
				}
				if !strings.Contains(readString(t, path), `"hash":"`+r.Hash+`"`) {
					t.Fatalf("Append %d returned before its record reached the file", i)
				}
			}
			s := l.Stats()
			wantSyncs := uint64(3) // one fsync per sequential Append
			if m.opts.Sync == SyncInterval {
				wantSyncs = 0 // the hour has not passed
			}
			if s.Records != 3 || s.Syncs != wantSyncs {
				t.Fatalf("Stats = %+v, want 3 records and %d fsyncs", s, wantSyncs)
			}
			must(t, l.Close())
			if s := l.Stats(); s.Syncs != wantSyncs+boolN(m.opts.Sync == SyncInterval) {
				t.Fatalf("after Close: %+v: Close must fsync what interval mode wrote", s)
			}
			if n := verifyFile(t, path); n != 3 {
				t.Fatalf("Verify = %d, want 3", n)
			}
		})
	}
}

func boolN(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func TestSyncIntervalFsyncsWithinTheInterval(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := OpenWith(path, Options{Sync: SyncInterval, SyncInterval: 20 * time.Millisecond})
	must(t, err)
	defer l.Close()
	appendN(t, l, 4)
	deadline := time.Now().Add(5 * time.Second)
	for l.Stats().Syncs == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("no background fsync within 5s of a 20ms interval: %+v", l.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if s := l.Stats(); s.Syncs > 4 || s.Records != 4 || l.Err() != nil {
		t.Fatalf("Stats = %+v, Err = %v: want the 4 records fsynced together", s, l.Err())
	}
}

func TestOpenRejectsBadSyncOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Options
		want string
	}{
		{"interval without a duration", Options{Sync: SyncInterval}, "sync interval must be positive"},
		{"negative interval", Options{Sync: SyncInterval, SyncInterval: -time.Second}, "sync interval must be positive"},
		{"unknown mode", Options{Sync: SyncMode(7)}, "unknown sync mode"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, err := OpenWith(filepath.Join(t.TempDir(), "audit.log"), tc.o)
			if err == nil {
				l.Close()
				t.Fatal("OpenWith accepted the options")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestFsyncFailureFailsTheLog: in both modes a failed fsync refuses every
// later Append until an fsync succeeds again, and no acknowledged record is
// missing from the file afterwards. In always mode the Append whose fsync
// failed fails itself; in interval mode it was acknowledged when written,
// and the failure shows at the background fsync.
func TestFsyncFailureFailsTheLog(t *testing.T) {
	for _, m := range syncModes {
		t.Run(m.name, func(t *testing.T) {
			o := m.opts
			if o.Sync == SyncInterval {
				o.SyncInterval = 10 * time.Millisecond
			}
			l, path, _, failSync := openFault(t, o)
			appendN(t, l, 2)
			failSync.Store(true)
			acked := 2
			_, err := l.Append(context.Background(), rec(2))
			switch o.Sync {
			case SyncAlways:
				if !errors.Is(err, syscall.EIO) {
					t.Fatalf("Append with a failing fsync = %v, want EIO", err)
				}
			case SyncInterval:
				if err != nil {
					t.Fatalf("Append (written, fsync later) = %v", err)
				}
				acked++
				deadline := time.Now().Add(5 * time.Second)
				for !errors.Is(l.Err(), syscall.EIO) {
					if time.Now().After(deadline) {
						t.Fatalf("Err() = %v 5s after a failed background fsync, want EIO", l.Err())
					}
					time.Sleep(5 * time.Millisecond)
				}
			}
			for i := range 3 { // the failed state keeps refusing
				if _, err := l.Append(context.Background(), rec(10+i)); !errors.Is(err, syscall.EIO) {
					t.Fatalf("Append %d in the failed state = %v, want EIO", i, err)
				}
			}
			if l.Err() == nil {
				t.Fatal("Err() = nil in the failed state")
			}
			failSync.Store(false)
			r, err := l.Append(context.Background(), rec(20))
			if err != nil {
				t.Fatalf("Append after recovery: %v", err)
			}
			acked++
			if r.Seq != uint64(acked) {
				t.Fatalf("seq after recovery = %d, want %d: refused records must not consume seqs", r.Seq, acked)
			}
			if l.Err() != nil {
				t.Fatalf("Err() = %v after recovery", l.Err())
			}
			must(t, l.Close())
			if n := verifyFile(t, path); n != acked {
				t.Fatalf("Verify = %d records, want the %d acknowledged", n, acked)
			}
		})
	}
}

// TestWriteFailureRefusesInBothModes: a write that fails (a full disk) fails
// its Append in interval mode as in always mode, so the gateway refuses the
// call before anything is sent; the log recovers when the disk has room.
func TestWriteFailureRefusesInBothModes(t *testing.T) {
	for _, m := range syncModes {
		t.Run(m.name+"/partial write", func(t *testing.T) {
			l, path, failWrite, _ := openFault(t, m.opts)
			appendN(t, l, 2)
			failWrite.Store(true)
			if _, err := l.Append(context.Background(), rec(2)); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Append on a full disk = %v, want ENOSPC", err)
			}
			if !errors.Is(l.Err(), syscall.ENOSPC) {
				t.Fatalf("Err() = %v, want ENOSPC", l.Err())
			}
			failWrite.Store(false)
			if r, err := l.Append(context.Background(), rec(3)); err != nil || r.Seq != 3 {
				t.Fatalf("Append after recovery = %d, %v, want seq 3", r.Seq, err)
			}
			must(t, l.Close())
			if n := verifyFile(t, path); n != 3 {
				t.Fatalf("Verify = %d, want 3 (the half-written line truncated away)", n)
			}
		})
		t.Run(m.name+"/dev/full", func(t *testing.T) {
			if _, err := os.Stat("/dev/full"); err != nil {
				t.Skip("no /dev/full on this system")
			}
			path := filepath.Join(t.TempDir(), "audit.log")
			must(t, os.Symlink("/dev/full", path))
			l, err := OpenWith(path, m.opts)
			must(t, err)
			defer l.Close()
			if _, err := l.Append(context.Background(), rec(0)); !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("Append = %v, want ENOSPC", err)
			}
		})
	}
}

// TestRotationInIntervalMode: a log renamed away with unsynced records is
// fsynced before the gateway lets go of it, and the new file continues the
// chain; a deleted one fails the batch that notices, as in always mode.
func TestRotationInIntervalMode(t *testing.T) {
	for _, tc := range []struct {
		name    string
		move    func(path string) error
		wantErr error
	}{
		{"renamed", func(p string) error { return os.Rename(p, p+".1") }, nil},
		{"deleted", os.Remove, ErrUnlinked},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, path, _, _ := openFault(t, Options{Sync: SyncInterval, SyncInterval: time.Hour})
			recs := appendN(t, l, 2)
			must(t, tc.move(path))
			_, err := l.Append(context.Background(), rec(2))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Append after the file was %s = %v, want %v", tc.name, err, tc.wantErr)
			}
			if tc.wantErr != nil {
				if _, err := l.Append(context.Background(), rec(3)); err != nil {
					t.Fatalf("Append after re-creation: %v", err)
				}
			} else {
				if s := l.Stats(); s.Syncs != 1 {
					t.Fatalf("Stats = %+v: the rotated file must be fsynced before it is closed", s)
				}
				if n := verifyFile(t, path+".1"); n != 2 {
					t.Fatalf("rotated file: %d records, want 2", n)
				}
			}
			must(t, l.Close())
			f, err := os.Open(path)
			must(t, err)
			defer f.Close()
			n, err := VerifyFrom(f, 3, recs[1].Hash)
			if err != nil || n != 2 {
				t.Fatalf("new file: VerifyFrom = %d, %v; want the marker and one record continuing the chain", n, err)
			}
		})
	}
}
