package vault

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"
)

// A change another process makes to the store — `sluice secrets set` and
// `delete` (a second Local on the same files), a file copied over it in
// place, the directory moved aside and replaced — is seen by the very
// next lookup after it, with no wait: the watch's queue is filled before
// the change's system call returns. A deleted secret fails closed.
func TestLocalWatchSeesChanges(t *testing.T) {
	ctx := context.Background()
	freeWatches(t, 2)
	gw, path, key := openTest(t)
	if gw.watch == nil {
		t.Fatal("no inotify watch on Linux: the lookups below would test the stat")
	}
	cli, err := OpenLocal(path, key)
	if err != nil {
		t.Fatal(err)
	}
	get := func(want string) {
		t.Helper()
		for range 3 { // the first lookup after a change, and the cached ones after it
			s, err := gw.Get(ctx, "tok", ScopeProject)
			if want == "" {
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("a deleted secret: %v, want ErrNotFound", err)
				}
				continue
			}
			if err != nil || string(s.Reveal()) != want {
				t.Fatalf("Get: %v (value %d bytes), want the %d-byte value set last", err, s.Len(), len(want))
			}
		}
	}
	set := func(v string) {
		t.Helper()
		if err := cli.Set(ctx, "tok", ScopeProject, NewSecret([]byte(v))); err != nil {
			t.Fatal(err)
		}
	}
	set("value-one")
	get("value-one")
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	set("value-two")
	get("value-two")
	if err := cli.Delete(ctx, "tok", ScopeProject); err != nil {
		t.Fatal(err)
	}
	get("")
	// Copied over in place (no rename): the file's own write.
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(old); err != nil {
		t.Fatal(err)
	}
	f.Close()
	get("value-one")
	// The store's directory moved aside and a new one put in its place:
	// the path now names another file, which has no such secret.
	dir := filepath.Dir(path)
	if err := os.Rename(dir, dir+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(`{"version":1,"secrets":{}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	get("")
	if !gw.watch.dead {
		t.Fatal("the watched directory moved: the watch should be dead and every lookup stat")
	}
}

// An unchanged store is answered without a stat of its file: fewer
// allocations per lookup than the stat fallback (os.Stat's FileInfo),
// counted, not timed.
func TestLocalWatchedLookupNoStat(t *testing.T) {
	ctx := context.Background()
	freeWatches(t, 1)
	l, _, _ := openTest(t)
	if l.watch == nil {
		t.Fatal("no watch")
	}
	if err := l.Set(ctx, "tok", ScopeProject, NewSecret([]byte("v"))); err != nil {
		t.Fatal(err)
	}
	lookup := func() {
		if _, err := l.Get(ctx, "tok", ScopeProject); err != nil {
			t.Fatal(err)
		}
	}
	lookup()
	watched := testing.AllocsPerRun(200, lookup)
	l.watch = nil
	statted := testing.AllocsPerRun(200, lookup)
	if watched >= statted {
		t.Fatalf("allocs per lookup: %v watched, %v with a stat each; the watch should spare the stat", watched, statted)
	}
	t.Logf("allocs per lookup: %v watched, %v with a stat each", watched, statted)
}

// BenchmarkLocalGet: one lookup of an unchanged store, watched (the
// watch's queue drained) and with the stat fallback (watch off).
func BenchmarkLocalGet(b *testing.B) {
	ctx := context.Background()
	for _, watched := range []bool{true, false} {
		name := "stat"
		if watched {
			name = "watched"
		}
		b.Run(name, func(b *testing.B) {
			freeWatches(b, 1)
			dir := b.TempDir()
			l, err := OpenLocal(filepath.Join(dir, "secrets.json"), filepath.Join(dir, "secrets.key"))
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Set(ctx, "tok", ScopeProject, NewSecret([]byte("bench-api-key-0123456789"))); err != nil {
				b.Fatal(err)
			}
			if !watched {
				l.watch = nil
			} else if l.watch == nil {
				b.Fatal("no watch")
			}
			b.ReportAllocs()
			for range b.N {
				if _, err := l.Get(ctx, "tok", ScopeProject); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// freeWatches collects the stores earlier tests left until n more may be
// watched (maxWatched is per process).
func freeWatches(t testing.TB, n int32) {
	t.Helper()
	for range 200 {
		if watched.Load()+n <= maxWatched {
			return
		}
		runtime.GC()
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%d stores still watched", watched.Load())
}

// Past maxWatched stores a process watches, a store stats instead — and
// still sees a change on the next lookup.
func TestLocalWatchBound(t *testing.T) {
	ctx := context.Background()
	freeWatches(t, maxWatched)
	var keep []*Local
	for range maxWatched {
		l, _, _ := openTest(t)
		keep = append(keep, l)
	}
	l, path, key := openTest(t)
	if l.watch != nil {
		t.Fatalf("store %d watched: the bound is %d", maxWatched+1, maxWatched)
	}
	cli, err := OpenLocal(path, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []string{"one", "two"} {
		if err := cli.Set(ctx, "tok", ScopeProject, NewSecret([]byte(v))); err != nil {
			t.Fatal(err)
		}
		if s, err := l.Get(ctx, "tok", ScopeProject); err != nil || string(s.Reveal()) != v {
			t.Fatalf("unwatched store: %v, want the value set last", err)
		}
	}
	runtime.KeepAlive(keep)
}
