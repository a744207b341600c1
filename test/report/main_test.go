package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

const catalogue = `# comment
## A. Sandbox escape / reach
A1 connect to the host -> refused
A2 unshare -> EPERM

## C. Network egress & DNS
C1 metadata -> 403
C2 IP spellings -> 403
`

func TestParseCatalogue(t *testing.T) {
	groups, err := parseCatalogue(strings.NewReader(catalogue))
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 || groups[0].letter != "A" || groups[1].title != "Network egress & DNS" ||
		len(groups[0].cases) != 2 || groups[1].cases[1].id != "C2" || groups[1].cases[1].desc != "IP spellings -> 403" {
		t.Fatalf("parsed %+v", groups)
	}
	bad := []struct{ name, src, want string }{
		{"case before any group", "A1 x\n", "outside group A"},
		{"case in the wrong group", "## A. a\nB1 x\n", "outside group B"},
		{"duplicate id", "## A. a\nA1 x\nA1 y\n", "A1 listed twice"},
		{"no id", "## A. a\njust words\n", "line 2"},
		{"empty", "# nothing\n", "no cases"},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parseCatalogue(strings.NewReader(tc.src)); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestParseNotes(t *testing.T) {
	notes, err := parseNotes(strings.NewReader("# c\nA2 needs a kernel feature\n\nC1 TLS interception (issue 6)\n"))
	if err != nil || notes["A2"] != "needs a kernel feature" || notes["C1"] != "TLS interception (issue 6)" || len(notes) != 2 {
		t.Fatalf("notes %v, %v", notes, err)
	}
	for name, src := range map[string]string{"no reason": "A1\n", "duplicate": "A1 x\nA1 y\n", "not an id": "xx y\n"} {
		if _, err := parseNotes(strings.NewReader(src)); err == nil {
			t.Errorf("%s: accepted %q", name, src)
		}
	}
}

// world writes a catalogue, notes and case lines to a temp dir.
func world(t *testing.T, gaps string, lines ...casebook.Line) (cases, threats, gapsPath, out string) {
	t.Helper()
	d := t.TempDir()
	cases = filepath.Join(d, "cases")
	if err := os.Mkdir(cases, 0o755); err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for _, l := range lines {
		j, _ := json.Marshal(l)
		b.Write(append(j, '\n'))
	}
	threats, gapsPath, out = filepath.Join(d, "threats.txt"), filepath.Join(d, "gaps.txt"), filepath.Join(d, "attack.md")
	for p, c := range map[string]string{filepath.Join(cases, "pkg.jsonl"): b.String(), threats: catalogue, gapsPath: gaps} {
		if err := os.WriteFile(p, []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cases, threats, gapsPath, out
}

func TestRun(t *testing.T) {
	pass := func(id, test string) casebook.Line {
		return casebook.Line{ID: id, Threat: "t " + test, Expected: "403", Observed: "403 | ok", Pass: true, Test: test, Package: "p"}
	}
	failing := casebook.Line{ID: "C1", Threat: "metadata", Expected: "403", Observed: "200", Pass: false, Test: "TestBad", Package: "p"}
	skipped := casebook.Line{ID: "C2", Threat: "spelling", Expected: "403", Observed: "-", Skipped: true, Test: "TestSkip", Package: "p"}
	unknown := pass("Z9", "TestTypo")

	cases := []struct {
		name     string
		gaps     string
		lines    []casebook.Line
		wantCode int
		want     []string // substrings of attack.md
		notWant  []string
		stderr   string
	}{
		{
			name:     "all pass, uncovered listed with reasons",
			gaps:     "A2 needs user namespaces\nA1 the partial bit\n",
			lines:    []casebook.Line{pass("A1", "TestA"), pass("C1", "TestC")},
			wantCode: exitOK,
			want: []string{
				"| A. Sandbox escape / reach | 1 | 2 | 1 | 0 |",
				"| A2 | unshare -> EPERM | — | — | **not covered**: needs user namespaces | — |",
				"| C2 | IP spellings -> 403 | — | — | **not covered**: no test registers it yet | — |",
				"| A1 | t TestA | 403 | 403 \\| ok | pass | `TestA` |",
				"- A1: the partial bit",
				"| **All** | **2** | **4** | **2** | **0** |",
			},
		},
		{
			name:     "a failed case fails the run and is shown",
			lines:    []casebook.Line{pass("A1", "TestA"), failing},
			wantCode: exitFailed,
			want:     []string{"| C1 | metadata | 403 | 200 | **FAIL** | `TestBad` |", "| C. Network egress & DNS | 1 | 2 | 1 | 1 |"},
			stderr:   "FAIL C1 TestBad",
		},
		{
			name:     "a skipped case is neither a failure nor coverage",
			lines:    []casebook.Line{skipped},
			wantCode: exitOK,
			want:     []string{"| C2 | spelling | 403 | - | skipped | `TestSkip` |", "| C. Network egress & DNS | 0 | 2 | 1 | 0 |"},
		},
		{
			name:     "an id outside the catalogue fails the run",
			lines:    []casebook.Line{unknown},
			wantCode: exitFailed,
			want:     []string{"**Recorded ids not in the catalogue:** Z9"},
			stderr:   "registered Z9",
		},
		{
			name:     "a note for an unknown id is an error",
			gaps:     "Q1 nothing\n",
			wantCode: exitError,
			stderr:   "Q1 is not in the catalogue",
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cdir, threats, gaps, out := world(t, tc.gaps, tc.lines...)
			var so, se bytes.Buffer
			code := run([]string{"-cases", cdir, "-threats", threats, "-gaps", gaps, "-out", out}, &so, &se)
			if code != tc.wantCode {
				t.Fatalf("exit %d, want %d; stderr %s", code, tc.wantCode, se.String())
			}
			if !strings.Contains(se.String(), tc.stderr) {
				t.Errorf("stderr %q does not contain %q", se.String(), tc.stderr)
			}
			if tc.wantCode == exitError {
				return
			}
			md, err := os.ReadFile(out)
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.want {
				if !bytes.Contains(md, []byte(w)) {
					t.Errorf("attack.md lacks %q:\n%s", w, md)
				}
			}
		})
	}
}

func TestCell(t *testing.T) {
	cases := []struct{ name, in, want string }{
		{"pipe is escaped", "a|b", `a\|b`},
		{"newlines fold", "a\n  b", "a b"},
		{"html is inert", "<script>", "&lt;script>"},
		{"backslash survives", `a\b`, `a\\b`},
		{"long is cut", strings.Repeat("x", 300), strings.Repeat("x", 240) + "…"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := cell(tc.in); got != tc.want {
				t.Errorf("cell(%q) = %q, want %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestCommittedCatalogue keeps threats.txt and gaps.txt parseable and
// consistent with each other, and checks the catalogue has groups A-G.
func TestCommittedCatalogue(t *testing.T) {
	f, err := os.Open("threats.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	groups, err := parseCatalogue(f)
	if err != nil {
		t.Fatal(err)
	}
	var letters string
	for _, g := range groups {
		letters += g.letter
	}
	if letters != "ABCDEFG" {
		t.Errorf("groups %q, want ABCDEFG", letters)
	}
	if _, err := build(t.TempDir(), "threats.txt", "gaps.txt"); err != nil {
		t.Errorf("gaps.txt against threats.txt: %v", err)
	}
}
