package casebook

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fakeT is a testing.TB whose failure and cleanups the test controls, so
// that a failing case can be recorded without failing this test.
type fakeT struct {
	testing.TB
	name     string
	failed   bool
	skipped  bool
	cleanups []func()
	errs     []string
}

func (f *fakeT) Helper()                        {}
func (f *fakeT) Name() string                   { return f.name }
func (f *fakeT) Failed() bool                   { return f.failed }
func (f *fakeT) Skipped() bool                  { return f.skipped }
func (f *fakeT) Cleanup(fn func())              { f.cleanups = append(f.cleanups, fn) }
func (f *fakeT) Errorf(format string, a ...any) { f.errs = append(f.errs, format) }

// finish runs the cleanups last-first, as testing does.
func (f *fakeT) finish() {
	for i := len(f.cleanups) - 1; i >= 0; i-- {
		f.cleanups[i]()
	}
}

func TestRecordWritesOneLinePerCase(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(EnvDir, dir)
	fileMu.Lock()
	file = nil // a fresh "binary" for this test
	fileMu.Unlock()
	t.Cleanup(func() {
		fileMu.Lock()
		if file != nil {
			file.Close()
			file = nil
		}
		fileMu.Unlock()
	})

	pass := &fakeT{name: "TestX/pass"}
	Record(pass, "C2", "0x7f000001 via a connector", "403 egress_denied", "403 egress_denied, 0 accepts")
	fail := &fakeT{name: "TestX/fail"}
	c := Expect(fail, "A1", "raw socket", "errno=EPERM")
	c.Observef("errno=%s", "EACCES")
	stopped := &fakeT{name: "TestX/stopped"}
	Expect(stopped, "B1", "fork bomb", "errno=EAGAIN")
	skipped := &fakeT{name: "TestX/skipped"}
	Record(skipped, "G3", "vault sealed", "503 credential_unavailable", "-")

	fail.failed, stopped.failed, skipped.skipped = true, true, true
	for _, f := range []*fakeT{pass, fail, stopped, skipped} {
		f.finish()
		if len(f.errs) != 0 {
			t.Fatalf("%s: cleanup errors %v", f.name, f.errs)
		}
	}

	names, _ := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if len(names) != 1 || !strings.Contains(filepath.Base(names[0]), "test_internal_casebook") {
		t.Fatalf("case files %v, want one named for this package", names)
	}
	lines, err := Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]Line{}
	for _, l := range lines {
		got[l.Test] = l
	}
	cases := []struct {
		name, test, id, observed string
		pass, skipped            bool
	}{
		{"passing case", "TestX/pass", "C2", "403 egress_denied, 0 accepts", true, false},
		{"failed case keeps its observation", "TestX/fail", "A1", "errno=EACCES", false, false},
		{"stopped before Observe is a failure", "TestX/stopped", "B1", NotObserved, false, false},
		{"skipped is not a pass", "TestX/skipped", "G3", "-", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l, ok := got[tc.test]
			if !ok {
				t.Fatalf("no line for %s in %v", tc.test, lines)
			}
			if l.ID != tc.id || l.Observed != tc.observed || l.Pass != tc.pass || l.Skipped != tc.skipped {
				t.Errorf("line %+v, want id %s observed %q pass %v skipped %v", l, tc.id, tc.observed, tc.pass, tc.skipped)
			}
			if l.Package != "github.com/sluice-gw/sluice/test/internal/casebook" {
				t.Errorf("package %q, want this test's import path", l.Package)
			}
		})
	}
	if len(lines) != 4 || lines[0].ID != "A1" || lines[3].ID != "G3" {
		t.Errorf("Read did not return the 4 lines sorted by id: %+v", lines)
	}
}

func TestReadRejectsBadLines(t *testing.T) {
	cases := []struct{ name, content, want string }{
		{"not JSON", "{\"id\":\n", "line 1"},
		{"missing id", `{"test":"TestX"}` + "\n", "missing id"},
		{"missing test", "\n" + `{"id":"A1"}` + "\n", "line 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "x.jsonl"), []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := Read(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Read = %v, want an error naming %q", err, tc.want)
			}
		})
	}
	t.Run("missing dir is no cases", func(t *testing.T) {
		ls, err := Read(filepath.Join(t.TempDir(), "absent"))
		if err != nil || len(ls) != 0 {
			t.Errorf("Read = %v, %v; want nothing and no error", ls, err)
		}
	})
}

func TestPackageOf(t *testing.T) {
	cases := []struct{ name, fn, want string }{
		{"test closure", "github.com/sluice-gw/sluice/test/e2e.TestEgressGuard.func3", "github.com/sluice-gw/sluice/test/e2e"},
		{"method", "github.com/sluice-gw/sluice/test/attack.(*T).Run", "github.com/sluice-gw/sluice/test/attack"},
		{"no dot", "runtime", ""},
		{"std", "testing.tRunner", "testing"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := packageOf(tc.fn); got != tc.want {
				t.Errorf("packageOf(%q) = %q, want %q", tc.fn, got, tc.want)
			}
		})
	}
}
