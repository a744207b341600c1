package main

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// writes records each Write to the underlying writer, as a pipe would see
// them.
type writes struct {
	mu    sync.Mutex
	calls []string
}

func (w *writes) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.calls = append(w.calls, string(p))
	return len(p), nil
}

func (w *writes) snapshot() (calls int, all string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.calls), strings.Join(w.calls, "")
}

func TestLogBufferHoldsInfoUntilFlush(t *testing.T) {
	var w writes
	lb := newLogBuffer(&w, time.Hour) // the timer never fires in this test
	log := slog.New(flushOnWarn{slog.NewJSONHandler(lb, nil), lb})

	log.Info("one", "n", 1)
	log.Info("two", "n", 2)
	if n, all := w.snapshot(); n != 0 {
		t.Fatalf("info lines were written before a flush: %d writes %q", n, all)
	}
	lb.Flush()
	n, all := w.snapshot()
	if n != 1 {
		t.Fatalf("flush made %d writes, want the two lines in 1", n)
	}
	if !strings.Contains(all, `"msg":"one"`) || strings.Index(all, `"msg":"one"`) > strings.Index(all, `"msg":"two"`) {
		t.Fatalf("flushed %q: want line one then line two", all)
	}
	lb.Flush()
	if n, _ := w.snapshot(); n != 1 {
		t.Fatalf("flushing an empty buffer wrote: %d writes", n)
	}
}

func TestLogBufferWritesWarningsAtOnce(t *testing.T) {
	var w writes
	lb := newLogBuffer(&w, time.Hour)
	log := slog.New(flushOnWarn{slog.NewJSONHandler(lb, nil), lb}).With("component", "test")

	log.Info("before")
	log.Warn("attention", "why", "test")
	n, all := w.snapshot()
	if n != 1 || !strings.Contains(all, `"msg":"before"`) || !strings.Contains(all, `"msg":"attention"`) {
		t.Fatalf("after a warning: %d writes %q; want the info line and the warning, in one write", n, all)
	}
	log.WithGroup("g").Error("failed")
	if n, all := w.snapshot(); n != 2 || !strings.Contains(all, `"msg":"failed"`) {
		t.Fatalf("an error from a derived logger was not written at once: %d writes %q", n, all)
	}
}

func TestLogBufferTimerFlushes(t *testing.T) {
	var w writes
	lb := newLogBuffer(&w, time.Millisecond)
	// awaitWritten waits for the timer to have written want in all.
	awaitWritten := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if _, all := w.snapshot(); all == want {
				return
			}
			if time.Now().After(deadline) {
				_, all := w.snapshot()
				t.Fatalf("the timer wrote %q, want %q", all, want)
			}
			time.Sleep(time.Millisecond)
		}
	}
	_, _ = lb.Write([]byte("line\n"))
	awaitWritten("line\n")
	// The timer re-arms for the next line.
	_, _ = lb.Write([]byte("again\n"))
	awaitWritten("line\nagain\n")
}

func TestLogBufferFullWritesInWrite(t *testing.T) {
	var w writes
	lb := newLogBuffer(&w, time.Hour)
	line := bytes.Repeat([]byte("x"), 1000)
	line[len(line)-1] = '\n'
	var sent int
	for sent < logBufferLimit {
		_, _ = lb.Write(line)
		sent += len(line)
	}
	n, all := w.snapshot()
	if n != 1 || len(all) != sent {
		t.Fatalf("after %d bytes (limit %d): %d writes of %d bytes; want everything in 1 write", sent, logBufferLimit, n, len(all))
	}
}

// Lines from many goroutines leave whole and, per goroutine, in order,
// across timer flushes, full-buffer flushes and warnings.
func TestLogBufferConcurrentOrder(t *testing.T) {
	var w writes
	lb := newLogBuffer(&w, 50*time.Microsecond)
	log := slog.New(flushOnWarn{slog.NewTextHandler(lb, nil), lb})
	const goroutines, lines = 8, 2000
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range lines {
				if i%500 == 0 {
					log.Warn("w", "g", g, "i", i)
				} else {
					log.Info("i", "g", g, "i", i, "pad", strings.Repeat("p", i%300))
				}
			}
		}()
	}
	wg.Wait()
	lb.Flush()
	_, all := w.snapshot()
	next := make([]int, goroutines)
	sc := bufio.NewScanner(strings.NewReader(all))
	sc.Buffer(nil, 1<<20)
	count := 0
	for sc.Scan() {
		var g, i int
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			t.Fatalf("torn line %q", sc.Text())
		}
		if _, err := fmt.Sscanf(f[3]+" "+f[4], "g=%d i=%d", &g, &i); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		if i != next[g] {
			t.Fatalf("goroutine %d: line %d came where %d was due", g, i, next[g])
		}
		next[g]++
		count++
	}
	if count != goroutines*lines {
		t.Fatalf("%d lines written, want %d", count, goroutines*lines)
	}
}
