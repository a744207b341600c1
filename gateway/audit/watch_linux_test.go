package audit

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The watch reports changes to the log's own name only, and once its
// directory is gone it reports a change every time.
func TestPathWatch(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	must(t, os.WriteFile(path, nil, 0o600))
	w := watchPath(path)
	if w == nil {
		t.Fatal("inotify is not available")
	}
	defer w.close()
	if w.changed() {
		t.Fatal("changed with nothing done")
	}
	// Other names in the directory: rotated files, temp files, exports.
	must(t, os.WriteFile(filepath.Join(dir, "audit.log.1"), []byte("x"), 0o600))
	must(t, os.Rename(filepath.Join(dir, "audit.log.1"), filepath.Join(dir, "audit.log.2")))
	must(t, os.Remove(filepath.Join(dir, "audit.log.2")))
	must(t, os.WriteFile(filepath.Join(dir, "audit.lo"), nil, 0o600))
	// Writing to the log itself does not change its name.
	must(t, os.WriteFile(path, []byte("line\n"), 0o600))
	if w.changed() {
		t.Fatal("changed after events for other names and a write to the log")
	}
	for _, tc := range []struct {
		name string
		do   func()
	}{
		{"renamed away", func() { must(t, os.Rename(path, path+".1")) }},
		{"created", func() { must(t, os.WriteFile(path, nil, 0o600)) }},
		{"deleted", func() { must(t, os.Remove(path)) }},
		{"hard-linked", func() { must(t, os.Link(path+".1", path)) }},
		{"renamed over", func() {
			must(t, os.WriteFile(filepath.Join(dir, "planted"), nil, 0o600))
			must(t, os.Rename(filepath.Join(dir, "planted"), path))
		}},
		{"symlinked", func() {
			must(t, os.Remove(path))
			if !w.changed() {
				t.Fatal("no change after a delete")
			}
			must(t, os.Symlink("/etc/passwd", path))
		}},
	} {
		tc.do()
		if !w.changed() {
			t.Fatalf("%s: no change reported", tc.name)
		}
		if w.changed() {
			t.Fatalf("%s: reported twice", tc.name)
		}
	}
	must(t, os.Rename(dir, dir+".moved"))
	t.Cleanup(func() { os.RemoveAll(dir + ".moved") })
	for range 3 {
		if !w.changed() {
			t.Fatal("the directory moved, and the watch reported no change")
		}
	}
}

// With its directory moved away the log can no longer trust the watch: it
// looks the path up before every batch, and still sees a rotation at once.
func TestLogAfterDirectoryMoved(t *testing.T) {
	ctx := context.Background()
	l, path := openTest(t)
	recs := appendN(t, l, 2)
	dir := filepath.Dir(path)
	must(t, os.Rename(dir, dir+".moved"))
	must(t, os.MkdirAll(dir, 0o700))
	r, err := l.Append(ctx, rec(2))
	if err != nil || r.Seq != 4 { // 3 is the marker
		t.Fatalf("Append after the directory moved = %+v, %v; want seq 4 in a new file", r, err)
	}
	f, err := os.Open(path)
	must(t, err)
	if n, err := VerifyFrom(f, 3, recs[1].Hash); err != nil || n != 2 {
		t.Fatalf("VerifyFrom(new file) = %d, %v", n, err)
	}
	f.Close()
	if n := verifyFile(t, filepath.Join(dir+".moved", "audit.log")); n != 2 {
		t.Fatalf("moved file: %d records, want 2", n)
	}
	// A rotation now, with no watch on the new directory.
	must(t, os.Rename(path, path+".1"))
	if r, err := l.Append(ctx, rec(3)); err != nil || r.Seq != 6 {
		t.Fatalf("Append after rotation = %+v, %v; want seq 6 in a new file", r, err)
	}
	f, err = os.Open(path + ".1")
	must(t, err)
	if n, err := VerifyFrom(f, 3, recs[1].Hash); err != nil || n != 2 {
		t.Fatalf("VerifyFrom(rotated file) = %d, %v; want the marker and record 4", n, err)
	}
	f.Close()
	must(t, os.WriteFile(path+".planted", nil, 0o600))
	must(t, os.Rename(path, path+".2"))
	must(t, os.Rename(path+".planted", path))
	if _, err := l.Append(ctx, rec(4)); !errors.Is(err, ErrReplaced) {
		t.Fatalf("Append with a planted file at the path = %v, want ErrReplaced", err)
	}
}
