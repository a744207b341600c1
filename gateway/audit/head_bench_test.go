package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkCheckHead is the gateway's start-up check of a log of 100,000
// records (~40 MB) against its last head.
func BenchmarkCheckHead(b *testing.B) {
	path := filepath.Join(b.TempDir(), "audit.log")
	l, err := OpenWith(path, Options{Sync: SyncInterval, SyncInterval: 100e6})
	if err != nil {
		b.Fatal(err)
	}
	var last Record
	for i := range 100_000 {
		if last, err = l.AppendWritten(context.Background(), rec(i)); err != nil {
			b.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		b.Fatal(err)
	}
	fi, _ := os.Stat(path)
	b.SetBytes(fi.Size())
	b.ResetTimer()
	for b.Loop() {
		if _, ok, err := CheckHead(path, Head{Seq: last.Seq, Hash: last.Hash}); err != nil || !ok {
			b.Fatal(ok, err)
		}
	}
}
