package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// BenchmarkAppendParallel measures Append from many goroutines: one fsync
// covers every record queued while the previous one ran.
func BenchmarkAppendParallel(b *testing.B) {
	l, err := Open(filepath.Join(b.TempDir(), "audit.log"))
	must(b, err)
	defer l.Close()
	b.SetParallelism(32) // 32 × GOMAXPROCS goroutines, like concurrent gateway requests
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := l.Append(context.Background(), rec(1)); err != nil {
				b.Error(err)
				return
			}
		}
	})
	s := l.Stats()
	b.ReportMetric(float64(s.Records)/float64(s.Syncs), "records/fsync")
}

// BenchmarkAppendSerialFsync is the baseline: one write and one fsync per
// record, no hashing.
func BenchmarkAppendSerialFsync(b *testing.B) {
	f, err := os.OpenFile(filepath.Join(b.TempDir(), "plain.log"), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	must(b, err)
	defer f.Close()
	line, err := json.Marshal(rec(1))
	must(b, err)
	line = append(line, '\n')
	b.ResetTimer()
	for b.Loop() {
		if _, err := f.Write(line); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzVerify(f *testing.F) {
	l, err := Open(filepath.Join(f.TempDir(), "seed.log"))
	must(f, err)
	for i := range 3 {
		if _, err := l.Append(context.Background(), rec(i)); err != nil {
			f.Fatal(err)
		}
	}
	must(f, l.Close())
	seed, err := os.ReadFile(l.path)
	must(f, err)
	// A valid three-record log.
	f.Add(seed)
	// The same log without its last newline.
	f.Add(seed[:len(seed)-1])
	// A line with a hash field but nothing else.
	f.Add([]byte(`{"hash":"` + ZeroHash + `"}` + "\n"))
	// Duplicate keys and a number where a string belongs.
	f.Add([]byte(`{"seq":1,"seq":"1","time":"x","prev":"","request_id":"","event":"","hash":"` + ZeroHash + `"}` + "\n"))
	// Empty input.
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		n, err := Verify(bytes.NewReader(data))
		var ve *VerifyError
		if err != nil && !errors.As(err, &ve) {
			t.Fatalf("Verify returned %T %v, want *VerifyError", err, err)
		}
		if n < 0 || n > bytes.Count(data, []byte("\n")) {
			t.Fatalf("Verify counted %d records in %d lines", n, bytes.Count(data, []byte("\n")))
		}
	})
}

// BenchmarkCallPairs is the gateway's pattern from 8 concurrent callers:
// each call writes its decision (AppendWritten, no fsync of its own),
// then its result (Append, durable before it returns). A decision
// record that waits behind another call's fsync holds its call back.
func BenchmarkCallPairs(b *testing.B) {
	dir := b.TempDir()
	if d := os.Getenv("AUDIT_BENCH_DIR"); d != "" {
		dir = d
	}
	l, err := Open(filepath.Join(dir, "pairs.log"))
	must(b, err)
	defer l.Close()
	b.SetParallelism(max(1, 8/runtime.GOMAXPROCS(0)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := l.AppendWritten(ctx, Record{RequestID: "r", Event: "decision", Fields: map[string]any{"tool": "t"}}); err != nil {
				b.Error(err)
				return
			}
			if _, err := l.Append(ctx, Record{RequestID: "r", Event: "result", Fields: map[string]any{"status": 200}}); err != nil {
				b.Error(err)
				return
			}
		}
	})
	s := l.Stats()
	b.ReportMetric(float64(s.Records)/float64(max(s.Syncs, 1)), "records/fsync")
}
