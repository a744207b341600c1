package connectors

import (
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/dlclark/regexp2"
)

// ecmaOnly compiles pattern as compileECMA did before the RE2 subset:
// regexp2 in ECMAScript mode, with the Unicode flag when it compiles.
func ecmaOnly(pattern string) (*regexp2.Regexp, error) {
	re, err := regexp2.Compile(pattern, regexp2.ECMAScript|regexp2.Unicode)
	if err != nil {
		re, err = regexp2.Compile(pattern, regexp2.ECMAScript)
	}
	return re, err
}

// TestRE2Subset: which patterns take RE2 and which stay with regexp2,
// each case the reason.
func TestRE2Subset(t *testing.T) {
	for _, c := range []struct {
		pattern string
		re2     bool
		why     string
	}{
		{`^[A-Z]{3}$`, true, "a currency code: classes, a count, anchors"},
		{`^[a-z0-9_-]+$`, true, "a slug"},
		{`^\d{4}-\d{2}-\d{2}$`, true, "a date: \\d is [0-9] in both"},
		{`^(?:cus|sub)_\w+$`, true, "a non-capturing group and \\w"},
		{`^https?:\/\/`, true, "escaped punctuation"},
		{`^a.c$`, false, "'.' excludes \\r, U+2028 and U+2029 in ECMA only"},
		{`^\S+$`, false, "\\S is Unicode-aware in ECMA"},
		{`^\s*$`, false, "\\s is Unicode-aware in ECMA"},
		{`\bword\b`, false, "word boundaries left out"},
		{`^\p{L}+$`, false, "Unicode properties"},
		{`^\u00e9$`, false, "\\u escapes: RE2 has none"},
		{`^(a)\1$`, false, "a back-reference"},
		{`^(?=a)a$`, false, "lookahead"},
		{`(?i)abc`, false, "an inline flag: ECMA has none"},
		{`(?<n>a)`, false, "named groups left out"},
		{`[]a]`, false, "an empty class in ECMA, a ']' in RE2"},
		{`[^]`, false, "any character in ECMA"},
		{`^é$`, false, "a non-ASCII literal"},
		{"a\tb", false, "a control character"},
		{`a{2,2000}`, false, "a count RE2 refuses (over 1000)"},
	} {
		t.Run(c.pattern, func(t *testing.T) {
			got := re2Pattern(c.pattern) != nil
			if got != c.re2 {
				t.Fatalf("re2Pattern(%q) took RE2: %v, want %v (%s)", c.pattern, got, c.re2, c.why)
			}
			// Whichever engine it takes, compileECMA still compiles it.
			if _, err := compileECMA(c.pattern); err != nil {
				t.Fatalf("compileECMA(%q): %v", c.pattern, err)
			}
		})
	}
	// The pattern the bench's schema has, through compileECMA: RE2.
	re, _ := compileECMA(`^[A-Z]{3}$`)
	if _, ok := re.(*regexp.Regexp); !ok || !re.MatchString("EUR") || re.MatchString("EUR\n") || re.MatchString("eur") {
		t.Fatalf("compileECMA(^[A-Z]{3}$) = %T, want an RE2 regexp matching EUR only", re)
	}
}

// FuzzRE2SubsetMatchesECMA holds the RE2 subset to ECMA's meaning: for
// every pattern re2Pattern takes, regexp2 in ECMAScript mode compiles it
// too and finds a match in exactly the same inputs.
func FuzzRE2SubsetMatchesECMA(f *testing.F) {
	f.Add(`^[A-Z]{3}$`, "EUR")          // a currency code
	f.Add(`^[A-Z]{3}$`, "EUR\n")        // '$' before a final newline: no match in either
	f.Add(`^\d+(?:-\d+)*$`, "1-22-333") // groups and \d
	f.Add(`[^a-c]x|y{2,}`, "\nx")       // a negated class matches a newline in both
	f.Add(`\W\w`, "é1")                 // \W takes non-ASCII in both
	f.Add(`^(ab|a)(b*)c$`, "abbc")      // alternation with backtracking
	f.Add(`a{,3}`, "a{,3}")             // a literal brace in both
	f.Add(`[\]\-\\]+`, `]-\`)           // escapes inside a class
	f.Add(`x*?y+?$`, "xxyy")            // lazy quantifiers
	f.Fuzz(func(t *testing.T, pattern, s string) {
		re := re2Pattern(pattern)
		if re == nil {
			return
		}
		e, err := ecmaOnly(pattern)
		if err != nil {
			t.Fatalf("RE2 takes %q but ECMA refuses it: %v", pattern, err)
		}
		e.MatchTimeout = regexp2.DefaultMatchTimeout // no clock: the fuzzer's own timeout bounds it
		want, err := e.MatchString(s)
		if err != nil {
			t.Fatalf("ECMA match of %q on %q: %v", pattern, s, err)
		}
		if got := re.MatchString(s); got != want {
			t.Fatalf("%q on %q: RE2 %v, ECMA %v", pattern, s, got, want)
		}
	})
}

// TestECMAPatternLateClock: a regexp2 timeout that comes before
// patternTimeout has passed on the monotonic clock (regexp2's own clock
// jumped: its goroutine ran late) is retried, so a valid argument is not
// refused; a match that keeps timing out fails closed once patternTimeout
// has passed; an error that is not a timeout fails at once.
func TestECMAPatternLateClock(t *testing.T) {
	timeout := errors.New("match timeout after 100ms on input `EUR`")
	for _, c := range []struct {
		name     string
		fails    int   // attempts that fail before one succeeds (-1: all)
		err      error // what a failing attempt returns
		want     bool
		attempts func(n int) bool
	}{
		{"the clock jumped twice, then the match runs", 2, timeout, true, func(n int) bool { return n == 3 }},
		{"every attempt times out: fails closed at the budget", -1, timeout, false, func(n int) bool { return n >= 1 }},
		{"another error: no retry", -1, errors.New("bug"), false, func(n int) bool { return n == 1 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			re, err := compileECMA(`^\S{3}$`) // \S: regexp2, not RE2
			if err != nil {
				t.Fatal(err)
			}
			e := re.(ecmaRegexp)
			n := 0
			e.match = func(s string) (bool, error) {
				n++
				if c.fails < 0 || n <= c.fails {
					time.Sleep(time.Millisecond) // a match that ran, then timed out
					return false, c.err
				}
				return e.re.MatchString(s)
			}
			start := time.Now()
			got := e.MatchString("EUR")
			took := time.Since(start)
			if got != c.want || !c.attempts(n) {
				t.Fatalf("MatchString = %v after %d attempts, want %v", got, n, c.want)
			}
			if c.fails < 0 && c.err == timeout && (took < patternTimeout || took > patternTimeout+time.Second) {
				t.Fatalf("kept timing out for %v, want about patternTimeout (%v)", took, patternTimeout)
			}
		})
	}
}

// TestECMAPatternBacktrackingFailsClosed: an argument that makes a
// pattern outside the RE2 subset backtrack catastrophically (ReDoS:
// `^(\w+\s?)+$` against a long word and a "!") is stopped and fails,
// within patternTimeout plus regexp2's clock slack; the same pattern still
// matches a valid argument.
func TestECMAPatternBacktrackingFailsClosed(t *testing.T) {
	re, err := compileECMA(`^(\w+\s?)+$`)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := re.(ecmaRegexp); !ok {
		t.Fatalf("compiled to %T, want regexp2 (\\s is outside the RE2 subset)", re)
	}
	if !re.MatchString("hello brave new world") {
		t.Fatal("a valid argument does not match")
	}
	start := time.Now()
	if re.MatchString(strings.Repeat("a", 64) + "!") {
		t.Fatal("the backtracking argument matched")
	}
	if took := time.Since(start); took < patternTimeout || took > patternTimeout+2*time.Second {
		t.Fatalf("the backtracking match stopped after %v, want about patternTimeout (%v) plus regexp2's clock period", took, patternTimeout)
	}
}
