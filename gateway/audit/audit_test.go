package audit

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

func openTest(t *testing.T) (*Log, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "logs", "audit.log")
	l, err := Open(path)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l, path
}

func rec(i int) Record {
	return Record{RequestID: fmt.Sprintf("req-%d", i), Event: "decision",
		Fields: map[string]any{"decision": "allow", "tool": "billing.list", "n": i, "big": int64(1) << 60, "html": "<a&b>"}}
}

func appendN(t *testing.T, l *Log, n int) []Record {
	t.Helper()
	var out []Record
	for i := range n {
		r, err := l.Append(context.Background(), rec(i))
		if err != nil {
			t.Fatalf("Append %d: %v", i, err)
		}
		out = append(out, r)
	}
	return out
}

func verifyFile(t *testing.T, path string) int {
	t.Helper()
	f, err := os.Open(path)
	must(t, err)
	defer f.Close()
	n, err := Verify(f)
	if err != nil {
		t.Fatalf("Verify(%s) after %d records: %v", filepath.Base(path), n, err)
	}
	return n
}

func TestAppendVerifyRoundTrip(t *testing.T) {
	l, path := openTest(t)
	recs := appendN(t, l, 5)
	prev := ZeroHash
	for i, r := range recs {
		if r.Seq != uint64(i+1) || r.Prev != prev || len(r.Hash) != 64 || r.Time.IsZero() || r.RequestID != fmt.Sprintf("req-%d", i) {
			t.Fatalf("record %d = %+v", i, r)
		}
		prev = r.Hash
	}
	if n := verifyFile(t, path); n != 5 {
		t.Fatalf("Verify = %d records, want 5", n)
	}
	// Each line is the record's JSON with the hash over its canonical form.
	lines := strings.Split(strings.TrimSuffix(readString(t, path), "\n"), "\n")
	if len(lines) != 5 || !strings.Contains(lines[2], `"hash":"`+recs[2].Hash+`"}`) {
		t.Fatalf("line 3 = %s, want hash %s", lines[2], recs[2].Hash)
	}
	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		fi, err := os.Stat(p)
		must(t, err)
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode %#o, want %#o", p, fi.Mode().Perm(), want)
		}
	}
	if s := l.Stats(); s.Records != 5 || s.Syncs != 5 || s.Failures != 0 {
		t.Errorf("Stats = %+v", s)
	}
}

func TestVerifyDetectsTampering(t *testing.T) {
	l, path := openTest(t)
	appendN(t, l, 6)
	must(t, l.Close())
	orig := strings.SplitAfter(readString(t, path), "\n")
	orig = orig[:len(orig)-1] // drop the empty string after the last "\n"

	// rehash recomputes line i's hash after an edit, as an attacker would.
	rehash := func(line string) string {
		b := []byte(strings.TrimSuffix(line, "\n"))
		canon := append(append([]byte{}, b[:len(b)-66]...), `"}`...)
		var r Record
		must(t, jsonUnmarshal(canon, &r))
		out, _, err := (&Log{now: func() time.Time { return r.Time }}).encode(r, nil, r.Seq, r.Prev)
		must(t, err)
		return string(out)
	}
	cases := []struct {
		name     string
		edit     func(lines []string) []string
		wantLine int
		reason   string
	}{
		{"edit a field", func(ls []string) []string {
			ls[2] = strings.Replace(ls[2], `"allow"`, `"block"`, 1)
			return ls
		}, 3, "hash mismatch"},
		{"delete a line", func(ls []string) []string { return append(ls[:2], ls[3:]...) }, 3, "seq 4, want 3"},
		{"swap two lines", func(ls []string) []string { ls[1], ls[2] = ls[2], ls[1]; return ls }, 2, "seq 3, want 2"},
		{"duplicate a line", func(ls []string) []string {
			return append(ls[:3], append([]string{ls[2]}, ls[3:]...)...)
		}, 4, "seq 3, want 4"},
		{"delete the first line", func(ls []string) []string { return ls[1:] }, 1, "seq 2, want 1"},
		{"cut bytes from the middle of a line", func(ls []string) []string {
			ls[3] = ls[3][:40] + ls[3][60:]
			return ls
		}, 4, ""},
		{"truncate the file mid-line", func(ls []string) []string {
			ls[5] = ls[5][:len(ls[5])/2]
			return ls
		}, 6, "unfinished write: the last"},
		{"a write cut inside the time", func(ls []string) []string {
			ls[5] = ls[5][:len(`{"seq":6,"time":"2026-`)]
			return ls
		}, 6, "are the start of record seq 6, cut short"},
		{"a write cut before its newline only", func(ls []string) []string {
			ls[5] = strings.TrimSuffix(ls[5], "\n")
			return ls
		}, 6, "record seq 6 whole but for its newline"},
		{"a partial last line that is not the next record", func(ls []string) []string {
			ls[5] = strings.Replace(ls[5][:len(ls[5])/2], `{"seq":6`, `{"seq":7`, 1)
			return ls
		}, 6, "partial last line without newline that is not the start of record seq 6"},
		{"a partial last line with another prev", func(ls []string) []string {
			i := strings.Index(ls[5], `"prev":"`) + 8
			flip := "0"
			if ls[5][i] == '0' {
				flip = "1"
			}
			ls[5] = ls[5][:i] + flip + ls[5][i+1:len(ls[5])-10]
			return ls
		}, 6, "not the start of record seq 6"},
		{"rehash an edited line: next link breaks", func(ls []string) []string {
			ls[2] = rehash(strings.Replace(ls[2], `"allow"`, `"block"`, 1))
			return ls
		}, 4, "prev does not match"},
		{"insert a forged line", func(ls []string) []string {
			return append(ls[:2], append([]string{rehash(ls[1])}, ls[2:]...)...)
		}, 3, "seq 2, want 3"},
		{"unknown key", func(ls []string) []string {
			ls[0] = strings.Replace(ls[0], `{"seq"`, `{"x":1,"seq"`, 1)
			return ls
		}, 1, "unknown field"},
		{"empty line", func(ls []string) []string { return append(ls[:1], append([]string{"\n"}, ls[1:]...)...) }, 2, "missing trailing hash"},
		{"uppercase hash", func(ls []string) []string {
			i := strings.LastIndex(ls[0], `"hash":"`) + 8
			ls[0] = ls[0][:i] + strings.ToUpper(ls[0][i:])
			return ls
		}, 1, "hash mismatch"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			lines := tc.edit(append([]string(nil), orig...))
			n, err := Verify(strings.NewReader(strings.Join(lines, "")))
			var ve *VerifyError
			if !errors.As(err, &ve) {
				t.Fatalf("Verify = %d, %v; want *VerifyError", n, err)
			}
			if ve.Line != tc.wantLine || !strings.Contains(ve.Reason, tc.reason) {
				t.Fatalf("VerifyError = line %d %q, want line %d %q", ve.Line, ve.Reason, tc.wantLine, tc.reason)
			}
			if n != tc.wantLine-1 {
				t.Fatalf("Verify counted %d records, want %d", n, tc.wantLine-1)
			}
		})
	}
	// Control: the untouched log verifies.
	if n, err := Verify(strings.NewReader(strings.Join(orig, ""))); err != nil || n != 6 {
		t.Fatalf("Verify(untouched) = %d, %v", n, err)
	}
}

func TestReopenContinuesChain(t *testing.T) {
	l, path := openTest(t)
	first := appendN(t, l, 3)
	must(t, l.Close())

	l2, err := Open(path)
	must(t, err)
	r, err := l2.Append(context.Background(), rec(3))
	must(t, err)
	if r.Seq != 4 || r.Prev != first[2].Hash {
		t.Fatalf("after reopen: seq %d prev %s, want 4 and %s", r.Seq, r.Prev, first[2].Hash)
	}
	must(t, l2.Close())
	if n := verifyFile(t, path); n != 4 {
		t.Fatalf("Verify = %d, want 4", n)
	}
}

func TestOpenTail(t *testing.T) {
	l, path := openTest(t)
	appendN(t, l, 3)
	must(t, l.Close())
	good := readString(t, path)
	lines := strings.SplitAfter(good, "\n")

	t.Run("partial last line is truncated away", func(t *testing.T) {
		must(t, os.WriteFile(path, []byte(good+lines[0][:30]), 0o600))
		l, err := Open(path)
		must(t, err)
		defer l.Close()
		if got := l.Stats().TruncatedTail; got != 30 {
			t.Fatalf("TruncatedTail = %d, want 30", got)
		}
		r, err := l.Append(context.Background(), rec(9))
		must(t, err)
		if r.Seq != 4 {
			t.Fatalf("seq = %d, want 4", r.Seq)
		}
		must(t, l.Close())
		if n := verifyFile(t, path); n != 4 {
			t.Fatalf("Verify = %d, want 4", n)
		}
	})
	t.Run("only a partial first line", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "a.log")
		must(t, os.WriteFile(p, []byte(lines[0][:10]), 0o600))
		l, err := Open(p)
		must(t, err)
		r, err := l.Append(context.Background(), rec(0))
		must(t, err)
		must(t, l.Close())
		if r.Seq != 1 || r.Prev != ZeroHash {
			t.Fatalf("record = %+v, want first of chain", r)
		}
	})
	t.Run("corrupt last line refuses to open", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "a.log")
		must(t, os.WriteFile(p, []byte(lines[0]+strings.Replace(lines[1], "decision", "decisioN", 1)), 0o600))
		_, err := Open(p)
		if err == nil || !strings.Contains(err.Error(), "last record is corrupt: hash mismatch") {
			t.Fatalf("Open = %v, want corrupt tail error", err)
		}
	})
	t.Run("second open is refused while the first holds the log", func(t *testing.T) {
		p := filepath.Join(t.TempDir(), "a.log")
		l, err := Open(p)
		must(t, err)
		defer l.Close()
		_, err = Open(p)
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			t.Fatalf("second Open = %v, want EWOULDBLOCK (in use)", err)
		}
	})
}

func TestConcurrentAppendsGroupCommit(t *testing.T) {
	l, path := openTest(t)
	const goroutines, each = 64, 8
	var wg sync.WaitGroup
	var failed atomic.Int32
	seen := make([]atomic.Bool, goroutines*each+1)
	for g := range goroutines {
		wg.Go(func() {
			for i := range each {
				r, err := l.Append(context.Background(), rec(g*each+i))
				if err != nil || seen[r.Seq].Swap(true) {
					failed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d appends failed or shared a seq", failed.Load())
	}
	must(t, l.Close())
	if n := verifyFile(t, path); n != goroutines*each {
		t.Fatalf("Verify = %d, want %d", n, goroutines*each)
	}
	s := l.Stats()
	t.Logf("stats: %+v (%.1f records per fsync)", s, float64(s.Records)/float64(s.Syncs))
	if s.Records != goroutines*each || s.Syncs >= s.Records {
		t.Fatalf("Stats = %+v: want %d records and fewer fsyncs than records", s, goroutines*each)
	}
}

func TestWriteToFullDisk(t *testing.T) {
	if _, err := os.Stat("/dev/full"); err != nil {
		t.Skip("no /dev/full on this system")
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	must(t, os.Symlink("/dev/full", path))
	l, err := Open(path)
	must(t, err)
	defer l.Close()
	for range 2 { // the failed state keeps failing
		_, err = l.Append(context.Background(), rec(0))
		if !errors.Is(err, syscall.ENOSPC) {
			t.Fatalf("Append = %v, want ENOSPC", err)
		}
	}
	if !errors.Is(l.Err(), syscall.ENOSPC) {
		t.Fatalf("Err() = %v, want ENOSPC", l.Err())
	}
	if s := l.Stats(); s.Failures != 2 || s.Records != 0 || s.Syncs != 0 {
		t.Fatalf("Stats = %+v", s)
	}
}

// faultFile is a real *os.File whose writes or fsyncs fail on demand. A
// failing write first writes half its bytes, like a disk filling mid-line.
type faultFile struct {
	*os.File
	failWrite, failSync *atomic.Bool
}

func (f faultFile) WriteAt(p []byte, off int64) (int, error) {
	if f.failWrite.Load() {
		n, _ := f.File.WriteAt(p[:len(p)/2], off)
		return n, &os.PathError{Op: "write", Path: f.Name(), Err: syscall.ENOSPC}
	}
	return f.File.WriteAt(p, off)
}

func (f faultFile) Sync() error {
	if f.failSync.Load() {
		return &os.PathError{Op: "sync", Path: f.Name(), Err: syscall.EIO}
	}
	return f.File.Sync()
}

func TestRecoversAfterWriteFailure(t *testing.T) {
	cases := []struct {
		name   string
		toggle func(w, s *atomic.Bool, on bool)
		errno  syscall.Errno
	}{
		{"partial write, disk full", func(w, _ *atomic.Bool, on bool) { w.Store(on) }, syscall.ENOSPC},
		{"fsync fails", func(_, s *atomic.Bool, on bool) { s.Store(on) }, syscall.EIO},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var failWrite, failSync atomic.Bool
			path := filepath.Join(t.TempDir(), "audit.log")
			l, err := open(path, Options{}, func(f *os.File) file { return faultFile{f, &failWrite, &failSync} })
			must(t, err)
			defer l.Close()
			appendN(t, l, 2)
			tc.toggle(&failWrite, &failSync, true)
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for i := range 8 {
				wg.Go(func() { _, err := l.Append(context.Background(), rec(100+i)); errs <- err })
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				if !errors.Is(err, tc.errno) {
					t.Fatalf("Append during fault = %v, want %v", err, tc.errno)
				}
			}
			if l.Err() == nil {
				t.Fatal("Err() = nil during fault")
			}
			tc.toggle(&failWrite, &failSync, false)
			r, err := l.Append(context.Background(), rec(3))
			if err != nil {
				t.Fatalf("Append after recovery: %v", err)
			}
			if r.Seq != 3 {
				t.Fatalf("seq after recovery = %d, want 3: failed records must not consume seqs", r.Seq)
			}
			if l.Err() != nil {
				t.Fatalf("Err() = %v after recovery", l.Err())
			}
			must(t, l.Close())
			if n := verifyFile(t, path); n != 3 {
				t.Fatalf("Verify = %d, want 3", n)
			}
		})
	}
}

func TestLogFileRemoved(t *testing.T) {
	ctx := context.Background()
	t.Run("unlinked: fail, then re-create continuing the chain", func(t *testing.T) {
		l, path := openTest(t)
		recs := appendN(t, l, 2)
		must(t, os.Remove(path))
		if _, err := l.Append(ctx, rec(2)); !errors.Is(err, ErrUnlinked) {
			t.Fatalf("Append after unlink = %v, want ErrUnlinked", err)
		}
		r, err := l.Append(ctx, rec(3))
		if err != nil {
			t.Fatalf("Append after re-create: %v", err)
		}
		if r.Seq != 4 { // 3 is the marker
			t.Fatalf("seq = %d, want 4", r.Seq)
		}
		f, err := os.Open(path)
		must(t, err)
		defer f.Close()
		if n, err := VerifyFrom(f, 3, recs[1].Hash); err != nil || n != 2 {
			t.Fatalf("VerifyFrom(new file) = %d, %v", n, err)
		}
		if first := strings.SplitN(readString(t, path), "\n", 2)[0]; !strings.Contains(first, `"event":"`+EventRecreated+`"`) {
			t.Fatalf("new file starts with %s, want the %s marker", first, EventRecreated)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Fatalf("re-created mode %#o", fi.Mode().Perm())
		}
	})
	t.Run("rotated by rename: continue in a new file", func(t *testing.T) {
		l, path := openTest(t)
		recs := appendN(t, l, 2)
		must(t, os.Rename(path, path+".1"))
		r, err := l.Append(ctx, rec(2))
		if err != nil || r.Seq != 4 {
			t.Fatalf("Append after rotation = %+v, %v; want seq 4", r, err)
		}
		if n := verifyFile(t, path+".1"); n != 2 {
			t.Fatalf("rotated file: %d records", n)
		}
		f, err := os.Open(path)
		must(t, err)
		defer f.Close()
		if n, err := VerifyFrom(f, 3, recs[1].Hash); err != nil || n != 2 {
			t.Fatalf("VerifyFrom(new file) = %d, %v", n, err)
		}
	})
	t.Run("replaced by another file: refuse to write into it", func(t *testing.T) {
		l, path := openTest(t)
		appendN(t, l, 1)
		must(t, os.Rename(path, path+".old"))
		must(t, os.WriteFile(path, []byte("planted\n"), 0o600))
		if _, err := l.Append(ctx, rec(1)); !errors.Is(err, ErrReplaced) {
			t.Fatalf("Append = %v, want ErrReplaced", err)
		}
		if got := readString(t, path); got != "planted\n" {
			t.Fatalf("planted file was written: %q", got)
		}
		must(t, os.Remove(path)) // operator moves it away: the log resumes
		if _, err := l.Append(ctx, rec(2)); err != nil {
			t.Fatalf("Append after the planted file was removed: %v", err)
		}
	})
	t.Run("appended to by another writer", func(t *testing.T) {
		l, path := openTest(t)
		appendN(t, l, 1)
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		f.WriteString("{}\n")
		f.Close()
		if _, err := l.Append(ctx, rec(1)); !errors.Is(err, ErrModified) {
			t.Fatalf("Append = %v, want ErrModified", err)
		}
	})
}

func TestAppendEdges(t *testing.T) {
	l, path := openTest(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := l.Append(ctx, rec(0)); !errors.Is(err, context.Canceled) {
		t.Fatalf("Append(canceled ctx) = %v", err)
	}
	bad := rec(0)
	bad.Fields["ch"] = make(chan int)
	if _, err := l.Append(context.Background(), bad); err == nil || !strings.Contains(err.Error(), "encode record") {
		t.Fatalf("Append(unencodable) = %v, want encode error", err)
	}
	big := Record{Event: "x", Fields: map[string]any{"s": strings.Repeat("a", MaxRecord)}}
	if _, err := l.Append(context.Background(), big); err == nil || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("Append(too big) = %v, want size error", err)
	}
	r, err := l.Append(context.Background(), rec(1))
	if err != nil || r.Seq != 1 {
		t.Fatalf("Append after refused records = %+v, %v; want seq 1", r, err)
	}
	must(t, l.Close())
	must(t, l.Close()) // idempotent
	if _, err := l.Append(context.Background(), rec(2)); !errors.Is(err, ErrClosed) {
		t.Fatalf("Append after Close = %v, want ErrClosed", err)
	}
	if n := verifyFile(t, path); n != 1 {
		t.Fatalf("Verify = %d, want 1", n)
	}
}

func readString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	return string(bytes.Clone(b))
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestAppendWrittenSkipsOnlyItsOwnFsync(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if _, err := l.AppendWritten(ctx, Record{RequestID: "r1", Event: "decision"}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"request_id":"r1"`) {
		t.Fatalf("AppendWritten returned before the record reached the file: %q", data)
	}
	if s := l.Stats(); s.Syncs != 0 || s.Records != 1 {
		t.Fatalf("after AppendWritten: %+v, want 1 record and no fsync", s)
	}
	if _, err := l.Append(ctx, Record{RequestID: "r1", Event: "result"}); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Syncs != 1 || s.Records != 2 {
		t.Fatalf("after Append: %+v, want 2 records and one fsync", s)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if n, err := Verify(f); err != nil || n != 2 {
		t.Fatalf("Verify = %d, %v", n, err)
	}
}
