package main

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// TestDebugTrace: unset, nothing is traced and no file is made; set, the
// file is created 0600 and holds a Go execution trace once stopped; a
// path that already exists is refused, never written over.
func TestDebugTrace(t *testing.T) {
	t.Setenv(debugTraceEnv, "")
	stop, err := startDebugTrace()
	if err != nil {
		t.Fatalf("unset: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("unset: stop: %v", err)
	}

	path := filepath.Join(t.TempDir(), "trace.out")
	t.Setenv(debugTraceEnv, path)
	stop, err = startDebugTrace()
	if err != nil {
		t.Fatalf("set: %v", err)
	}
	if err := stop(); err != nil {
		t.Fatalf("set: stop: %v", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("trace file mode %v, want 0600", st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.HasPrefix(b, []byte("go 1.")) { // the execution trace's header
		t.Errorf("trace file starts %q, want a Go execution trace", b[:min(len(b), 16)])
	}

	if _, err := startDebugTrace(); !errors.Is(err, fs.ErrExist) {
		t.Fatalf("existing file: err = %v, want fs.ErrExist (never written over)", err)
	}
	if b2, _ := os.ReadFile(path); !bytes.Equal(b, b2) {
		t.Fatal("the existing trace file was changed")
	}
}
