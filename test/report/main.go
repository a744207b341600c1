// Command report turns the cases the attack and e2e suites recorded (see
// package casebook) into test/report/attack.md: one table per catalogue
// group A–G with case, threat, expected, observed and pass, and every
// catalogue case no test registered listed as not covered, with the reason
// from gaps.txt. It exits 1 when a registered case failed or names an id
// the catalogue does not have, so `./test.sh` fails with the suite; cases
// that are not covered do not fail it (they are listed, not hidden).
//
// Usage (from anywhere in the module):
//
//	go run ./test/report [-cases dir] [-threats file] [-gaps file] [-out file]
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

func main() { os.Exit(run(os.Args[1:], os.Stdout, os.Stderr)) }

// Exit codes.
const (
	exitOK     = 0
	exitFailed = 1 // a registered case failed, or names an unknown id
	exitError  = 2 // the report could not be made
)

func run(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("report", flag.ContinueOnError)
	fs.SetOutput(stderr)
	root, rootErr := casebook.ModuleRoot()
	casesDefault, _ := casebook.Dir()
	here := filepath.Join(root, "test", "report")
	cases := fs.String("cases", casesDefault, "directory of recorded case files (*.jsonl)")
	threats := fs.String("threats", filepath.Join(here, "threats.txt"), "the catalogue: group headers and case ids")
	gaps := fs.String("gaps", filepath.Join(here, "gaps.txt"), "reasons a case is not (fully) covered")
	out := fs.String("out", filepath.Join(here, "attack.md"), "the report to write")
	if err := fs.Parse(args); err != nil {
		return exitError
	}
	if rootErr != nil && (*cases == "" || !filepath.IsAbs(*threats)) {
		// Defaults need the module root; explicit flags do not.
		fmt.Fprintln(stderr, "report:", rootErr)
		return exitError
	}
	rep, err := build(*cases, *threats, *gaps)
	if err != nil {
		fmt.Fprintln(stderr, "report:", err)
		return exitError
	}
	var b strings.Builder
	rep.render(&b)
	if err := os.WriteFile(*out, []byte(b.String()), 0o644); err != nil {
		fmt.Fprintln(stderr, "report: write:", err)
		return exitError
	}
	fmt.Fprintf(stdout, "report: wrote %s\n", *out)
	for _, g := range rep.groups {
		fmt.Fprintf(stdout, "report: %s covered %d/%d, %d cases recorded, %d failed\n", g.letter, g.covered(), len(g.cases), g.recorded(), g.failed())
	}
	code := exitOK
	for _, id := range rep.unknown {
		fmt.Fprintf(stderr, "report: a test registered %s, which is not in %s\n", id, *threats)
		code = exitFailed
	}
	for _, l := range rep.failures() {
		fmt.Fprintf(stderr, "report: FAIL %s %s (%s): observed %s\n", l.ID, l.Test, l.Package, l.Observed)
		code = exitFailed
	}
	return code
}

// entry is one catalogue case.
type entry struct {
	id, desc string
	lines    []casebook.Line // what the suites recorded for it
}

type group struct {
	letter, title string
	cases         []*entry
}

func (g *group) covered() int {
	n := 0
	for _, e := range g.cases {
		if e.covered() {
			n++
		}
	}
	return n
}

func (g *group) recorded() int {
	n := 0
	for _, e := range g.cases {
		n += len(e.lines)
	}
	return n
}

func (g *group) failed() int {
	n := 0
	for _, e := range g.cases {
		for _, l := range e.lines {
			if failed(l) {
				n++
			}
		}
	}
	return n
}

// covered: at least one recorded case ran (was not skipped).
func (e *entry) covered() bool {
	for _, l := range e.lines {
		if !l.Skipped {
			return true
		}
	}
	return false
}

func failed(l casebook.Line) bool { return !l.Pass && !l.Skipped }

type report struct {
	groups  []*group
	gaps    map[string]string
	unknown []string          // ids recorded that the catalogue lacks
	runs    map[string]string // package -> time of its latest recorded case
}

func (r *report) failures() []casebook.Line {
	var out []casebook.Line
	for _, g := range r.groups {
		for _, e := range g.cases {
			for _, l := range e.lines {
				if failed(l) {
					out = append(out, l)
				}
			}
		}
	}
	return out
}

func build(casesDir, threatsPath, gapsPath string) (*report, error) {
	tf, err := os.Open(threatsPath)
	if err != nil {
		return nil, fmt.Errorf("catalogue: %w", err)
	}
	defer tf.Close()
	groups, err := parseCatalogue(tf)
	if err != nil {
		return nil, fmt.Errorf("catalogue %s: %w", filepath.Base(threatsPath), err)
	}
	byID := map[string]*entry{}
	for _, g := range groups {
		for _, e := range g.cases {
			byID[e.id] = e
		}
	}
	gaps := map[string]string{}
	if gapsPath != "" {
		gf, err := os.Open(gapsPath)
		if err != nil {
			return nil, fmt.Errorf("gaps: %w", err)
		}
		defer gf.Close()
		if gaps, err = parseNotes(gf); err != nil {
			return nil, fmt.Errorf("gaps %s: %w", filepath.Base(gapsPath), err)
		}
		for id := range gaps {
			if byID[id] == nil {
				return nil, fmt.Errorf("gaps %s: %s is not in the catalogue", filepath.Base(gapsPath), id)
			}
		}
	}
	lines, err := casebook.Read(casesDir)
	if err != nil {
		return nil, err
	}
	r := &report{groups: groups, gaps: gaps, runs: map[string]string{}}
	seen := map[string]bool{}
	for _, l := range lines {
		if l.Time > r.runs[l.Package] {
			r.runs[l.Package] = l.Time
		}
		e := byID[l.ID]
		if e == nil {
			if !seen[l.ID] {
				r.unknown = append(r.unknown, l.ID)
				seen[l.ID] = true
			}
			continue
		}
		e.lines = append(e.lines, l)
	}
	return r, nil
}

var (
	groupRE = regexp.MustCompile(`^## ([A-Z])\. (.+)$`)
	caseRE  = regexp.MustCompile(`^([A-Z])([0-9]+) (.+)$`)
)

// parseCatalogue reads threats.txt: "## X. Title" starts group X, then
// "X<n> description" lines. Blank lines and "#" comments are skipped.
func parseCatalogue(r io.Reader) ([]*group, error) {
	var groups []*group
	ids := map[string]bool{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if m := groupRE.FindStringSubmatch(l); m != nil {
			groups = append(groups, &group{letter: m[1], title: m[2]})
			continue
		}
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		m := caseRE.FindStringSubmatch(l)
		if m == nil {
			return nil, fmt.Errorf("line %d: want \"ID description\", got %q", n, l)
		}
		if len(groups) == 0 || groups[len(groups)-1].letter != m[1] {
			return nil, fmt.Errorf("line %d: %s%s is outside group %s", n, m[1], m[2], m[1])
		}
		id := m[1] + m[2]
		if ids[id] {
			return nil, fmt.Errorf("line %d: %s listed twice", n, id)
		}
		ids[id] = true
		g := groups[len(groups)-1]
		g.cases = append(g.cases, &entry{id: id, desc: m[3]})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		return nil, errors.New("no cases")
	}
	return groups, nil
}

// parseNotes reads gaps.txt: "ID reason" lines, "#" comments.
func parseNotes(r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		id, why, ok := strings.Cut(l, " ")
		if !ok || !caseRE.MatchString(l) {
			return nil, fmt.Errorf("line %d: want \"ID reason\", got %q", n, l)
		}
		if _, dup := out[id]; dup {
			return nil, fmt.Errorf("line %d: %s listed twice", n, id)
		}
		out[id] = strings.TrimSpace(why)
	}
	return out, sc.Err()
}

// cell makes s safe inside a Markdown table cell and bounds its length.
func cell(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if r := []rune(s); len(r) > 240 {
		s = string(r[:240]) + "…"
	}
	s = strings.ReplaceAll(s, `\`, `\\`)
	s = strings.ReplaceAll(s, "|", `\|`)
	s = strings.ReplaceAll(s, "<", "&lt;")
	return s
}

func (r *report) render(w io.Writer) {
	p := func(format string, a ...any) { fmt.Fprintf(w, format, a...) }
	p("# Attack-and-fault report\n\n")
	p("Generated by `go run ./test/report` from the cases that `test/attack`, `test/browser`, `test/e2e` and `test/fault` recorded\n")
	p("(`test/internal/casebook`) against the catalogue in `test/report/threats.txt` (THREATS.md, groups A–G).\n")
	if len(r.runs) > 0 {
		// Each test binary rewrites its own file: a package whose time is
		// older than the others was not run (or recorded nothing) last time.
		var runs []string
		for pkg, at := range r.runs {
			runs = append(runs, fmt.Sprintf("`%s` %s", strings.TrimPrefix(pkg, "github.com/sluice-gw/sluice/"), at))
		}
		sort.Strings(runs)
		p("Latest case per suite: %s.\n", strings.Join(runs, ", "))
	}
	p("A case is covered when a suite asserted it in a real run (sandboxes made by sandboxd, the gateway in a\n")
	p("network namespace); \"not covered\" names the reason and, where one exists, the unit test that covers it\n")
	p("outside the suite. Pass is the test's own verdict (`!t.Failed()` after it ended).\n\n")

	p("| Group | Covered | Total | Cases recorded | Failed |\n|---|---|---|---|---|\n")
	var cov, tot, rec, fail int
	for _, g := range r.groups {
		p("| %s. %s | %d | %d | %d | %d |\n", g.letter, cell(g.title), g.covered(), len(g.cases), g.recorded(), g.failed())
		cov, tot, rec, fail = cov+g.covered(), tot+len(g.cases), rec+g.recorded(), fail+g.failed()
	}
	p("| **All** | **%d** | **%d** | **%d** | **%d** |\n", cov, tot, rec, fail)
	if len(r.unknown) > 0 {
		p("\n**Recorded ids not in the catalogue:** %s\n", strings.Join(r.unknown, ", "))
	}

	for _, g := range r.groups {
		p("\n## %s. %s\n\n", g.letter, cell(g.title))
		p("| Case | Threat | Expected | Observed | Pass | Test |\n|---|---|---|---|---|---|\n")
		var partial []*entry
		for _, e := range g.cases {
			if len(e.lines) == 0 {
				why := r.gaps[e.id]
				if why == "" {
					why = "no test registers it yet"
				}
				p("| %s | %s | — | — | **not covered**: %s | — |\n", e.id, cell(e.desc), cell(why))
				continue
			}
			for _, l := range e.lines {
				verdict := "pass"
				switch {
				case l.Skipped:
					verdict = "skipped"
				case !l.Pass:
					verdict = "**FAIL**"
				}
				p("| %s | %s | %s | %s | %s | `%s` |\n", e.id, cell(l.Threat), cell(l.Expected), cell(l.Observed), verdict, cell(l.Test))
			}
			if r.gaps[e.id] != "" {
				partial = append(partial, e)
			}
		}
		if len(partial) > 0 {
			p("\nNot yet asserted by the suite for covered cases:\n\n")
			for _, e := range partial {
				p("- %s: %s\n", e.id, r.gaps[e.id])
			}
		}
	}
}
