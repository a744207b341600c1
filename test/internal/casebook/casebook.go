// Package casebook records which case of the attack-and-fault catalogue
// (THREATS.md, groups A–G) a test asserted, what it expected, what it
// actually observed and whether it passed, so that `go run ./test/report`
// can turn one run of the suites into test/report/attack.md.
//
// Each named case calls Record (or Expect, then Observe once it has seen
// the outcome). The line is written in a t.Cleanup, after the test and its
// subtests finished, so pass is !t.Failed() of the test that made the
// claim: a case cannot be reported as passing while its assertions failed.
// A case whose test stops (t.Fatal) before Observe is still written, with
// the observation it did not reach, so a failure is never silently lost.
//
// Lines go to $SLUICE_REPORT_DIR (default test/report/cases under the
// module root), one JSON Lines file per test binary (named for its
// package), truncated when that binary writes its first case and appended
// to after that: binaries never share a file, and the files hold the
// latest run of each package.
package casebook

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvDir names the environment variable that overrides the case directory.
const EnvDir = "SLUICE_REPORT_DIR"

// NotObserved is the observation of a case whose test stopped before it
// called Observe.
const NotObserved = "(test stopped before observing the outcome)"

// Line is one recorded case, one JSON object per line.
type Line struct {
	ID       string `json:"id"`       // catalogue id, e.g. "C2"
	Threat   string `json:"threat"`   // the variant this test tried
	Expected string `json:"expected"` // the designed outcome
	Observed string `json:"observed"` // what the test actually saw
	Pass     bool   `json:"pass"`     // !t.Failed() after the test ended
	Skipped  bool   `json:"skipped,omitempty"`
	Test     string `json:"test"`    // t.Name()
	Package  string `json:"package"` // import path of the test
	Time     string `json:"time"`    // RFC 3339, UTC
}

// Case is a claim made by one test; its line is written when the test ends.
type Case struct {
	mu       sync.Mutex
	observed string
}

// Observe sets what the test saw (the errno, the status and code, ...).
// The last call wins.
func (c *Case) Observe(observed string) {
	c.mu.Lock()
	c.observed = observed
	c.mu.Unlock()
}

// Observef is Observe with fmt.Sprintf formatting.
func (c *Case) Observef(format string, args ...any) {
	c.Observe(fmt.Sprintf(format, args...))
}

// Expect registers that t asserts catalogue case id (variant threat, with
// the designed outcome expected). Call Observe with what the test saw.
func Expect(t testing.TB, id, threat, expected string) *Case {
	t.Helper()
	c := &Case{observed: NotObserved}
	pkg := callerPackage()
	t.Cleanup(func() {
		c.mu.Lock()
		obs := c.observed
		c.mu.Unlock()
		l := Line{
			ID: id, Threat: threat, Expected: expected, Observed: obs,
			Pass: !t.Failed() && !t.Skipped(), Skipped: t.Skipped(),
			Test: t.Name(), Package: pkg, Time: time.Now().UTC().Format(time.RFC3339),
		}
		if err := write(l); err != nil {
			t.Errorf("casebook: %v", err)
		}
	})
	return c
}

// Record registers that t asserts catalogue case id and saw observed.
func Record(t testing.TB, id, threat, expected, observed string) {
	t.Helper()
	Expect(t, id, threat, expected).Observe(observed)
}

// Dir is the directory case files go to: $SLUICE_REPORT_DIR, else
// test/report/cases under the module root found from the working directory.
func Dir() (string, error) {
	if d := os.Getenv(EnvDir); d != "" {
		return d, nil
	}
	root, err := ModuleRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "test", "report", "cases"), nil
}

// ModuleRoot walks up from the working directory to the directory holding
// go.mod.
func ModuleRoot() (string, error) {
	d, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("module root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return d, nil
		}
		up := filepath.Dir(d)
		if up == d {
			return "", errors.New("module root: no go.mod above the working directory")
		}
		d = up
	}
}

var (
	fileMu sync.Mutex
	file   *os.File // this binary's case file, opened on the first write
)

func write(l Line) error {
	b, err := json.Marshal(l)
	if err != nil {
		return fmt.Errorf("encode %s: %w", l.ID, err)
	}
	fileMu.Lock()
	defer fileMu.Unlock()
	if file == nil {
		dir, err := Dir()
		if err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("case dir: %w", err)
		}
		name := strings.NewReplacer("/", "_", ".", "_").Replace(l.Package) + ".jsonl"
		f, err := os.OpenFile(filepath.Join(dir, name), os.O_CREATE|os.O_TRUNC|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("case file: %w", err)
		}
		file = f // held open for the life of the test binary
	}
	if _, err := file.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("write %s: %w", l.ID, err)
	}
	return nil
}

// callerPackage is the import path of the first caller outside this
// package's own (non-test) code, taken from its function name ("example.com/x/y.TestZ.func1").
func callerPackage() string {
	pcs := make([]uintptr, 16)
	n := runtime.Callers(2, pcs)
	frames := runtime.CallersFrames(pcs[:n])
	self := packageOf(runtime.FuncForPC(reflect.ValueOf(Record).Pointer()).Name())
	for {
		f, more := frames.Next()
		p := packageOf(f.Function)
		if p != "" && (p != self || strings.HasSuffix(f.File, "_test.go")) {
			return p
		}
		if !more {
			return "unknown"
		}
	}
}

// packageOf cuts a qualified function name to its import path.
func packageOf(fn string) string {
	slash := strings.LastIndex(fn, "/")
	dot := strings.Index(fn[slash+1:], ".")
	if dot < 0 {
		return ""
	}
	return fn[:slash+1+dot]
}

// Read parses every *.jsonl file in dir, sorted by id, package and test.
// A missing dir is no cases, not an error.
func Read(dir string) ([]Line, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.jsonl"))
	if err != nil {
		return nil, fmt.Errorf("read cases: %w", err)
	}
	var out []Line
	for _, name := range names {
		ls, err := readFile(name)
		if err != nil {
			return nil, err
		}
		out = append(out, ls...)
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.ID != b.ID {
			return a.ID < b.ID
		}
		if a.Package != b.Package {
			return a.Package < b.Package
		}
		return a.Test < b.Test
	})
	return out, nil
}

func readFile(name string) ([]Line, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, fmt.Errorf("read cases: %w", err)
	}
	defer f.Close()
	var out []Line
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if len(strings.TrimSpace(sc.Text())) == 0 {
			continue
		}
		var l Line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("read cases: %s line %d: %w", filepath.Base(name), n, err)
		}
		if l.ID == "" || l.Test == "" {
			return nil, fmt.Errorf("read cases: %s line %d: missing id or test", filepath.Base(name), n)
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read cases: %s: %w", filepath.Base(name), err)
	}
	return out, nil
}
