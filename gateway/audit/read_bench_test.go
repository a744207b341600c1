package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// benchLog writes n records like the gateway's to a log and returns its
// path and size.
func benchLog(b *testing.B, n int) (string, int64) {
	b.Helper()
	path := filepath.Join(b.TempDir(), "audit.log")
	l, err := OpenWith(path, Options{Sync: SyncInterval, SyncInterval: time.Second})
	must(b, err)
	for i := range n {
		if _, err := l.Append(context.Background(), rec(i)); err != nil {
			b.Fatal(err)
		}
	}
	must(b, l.Close())
	fi, err := os.Stat(path)
	must(b, err)
	return path, fi.Size()
}

// BenchmarkScan is what a view of the review UI's audit table or a
// session's timeline costs: the chain verified and every line decoded.
// BenchmarkScanBaselineVerify is `sluice audit verify`'s work on the same
// file; Scan costs about verify plus one JSON decode per line.
func BenchmarkScan(b *testing.B) {
	path, size := benchLog(b, 20000)
	b.SetBytes(size)
	for b.Loop() {
		n := 0
		if _, err := Scan(path, func(Entry) { n++ }); err != nil || n != 20000 {
			b.Fatal(n, err)
		}
	}
}

func BenchmarkScanBaselineVerify(b *testing.B) {
	path, size := benchLog(b, 20000)
	b.SetBytes(size)
	for b.Loop() {
		f, err := os.Open(path)
		must(b, err)
		if n, err := Verify(f); err != nil || n != 20000 {
			b.Fatal(n, err)
		}
		f.Close()
	}
}
