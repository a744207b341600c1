package connectors

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dlclark/regexp2"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/santhosh-tekuri/jsonschema/v6/kind"
	"golang.org/x/text/language"
	"golang.org/x/text/message"
)

// patternTimeout bounds one pattern match on an argument. Patterns are
// ECMA-262 (what OpenAPI and JSON Schema say they are), so they may
// backtrack; a match that runs this long fails, and the argument with it.
const patternTimeout = 100 * time.Millisecond

// ecmaRegexp is a pattern compiled by regexp2 in ECMAScript mode.
type ecmaRegexp struct {
	re *regexp2.Regexp
	// match is re.MatchString; tests replace it to play a late clock.
	match func(string) (bool, error)
}

func (e ecmaRegexp) String() string { return e.re.String() }

// MatchString fails closed: a match that runs out of its time is no
// match. The time is measured on Go's monotonic clock from the first
// attempt, not by regexp2 alone: regexp2 reads its deadline from a clock
// that a goroutine advances every 100 ms, and when that goroutine runs
// late (a loaded host) the clock jumps past the deadline of a match that
// started a moment ago, which then fails although it ran for far less
// than patternTimeout. Such a timeout is retried while the monotonic time
// since the first attempt is under patternTimeout; a pattern that really
// backtracks for that long is stopped (by regexp2's timeout, at most
// about patternTimeout plus two of its clock periods after the start) and
// fails. Any error that is not a timeout fails at once.
func (e ecmaRegexp) MatchString(s string) bool {
	start := time.Now()
	for {
		ok, err := e.match(s)
		if err == nil {
			return ok
		}
		if !strings.Contains(err.Error(), "match timeout") || time.Since(start) >= patternTimeout {
			return false
		}
	}
}

func compileECMA(pattern string) (jsonschema.Regexp, error) {
	if re := re2Pattern(pattern); re != nil {
		return re, nil
	}
	re, err := regexp2.Compile(pattern, regexp2.ECMAScript|regexp2.Unicode)
	if err != nil {
		// Some vendor patterns use escapes that the Unicode flag forbids
		// (`\-` outside a class); ECMA-262 without it accepts them.
		re, err = regexp2.Compile(pattern, regexp2.ECMAScript)
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", pattern, err)
		}
	}
	re.MatchTimeout = patternTimeout
	return ecmaRegexp{re: re, match: re.MatchString}, nil
}

// re2Pattern compiles pattern with Go's RE2 engine when it is written in
// a subset of ECMA-262 that RE2 reads the same way, else it returns nil
// and the pattern goes to regexp2. RE2 matches in linear time, so it
// needs no timeout; regexp2's does not hold under load: its deadline is
// read from a clock a background goroutine updates every 100 ms, and when
// that goroutine runs late (a busy host, many concurrent calls) every
// match started meanwhile is past its deadline at once and fails. Since a
// timeout fails closed, valid arguments ("EUR" for ^[A-Z]{3}$) were then
// refused as schema violations (seen in test/bench at 64 callers).
//
// The subset is ASCII literals and the escapes \d \D \w \W (ASCII in both
// engines), escaped punctuation, \t \n \r \f, classes and ranges, groups
// (capturing or "(?:"), alternation, the quantifiers and anchors. It leaves
// out, because the engines differ on them or RE2 lacks them: "." (ECMA
// excludes \r and U+2028/9 too), \s and \S (ECMA's are Unicode), \b and
// \B, \p, \u, \x, \c, back-references, lookaround and inline flags,
// "[]" and "[^]" (an empty class in ECMA, a "]" in RE2) and any non-ASCII
// character. FuzzRE2SubsetMatchesECMA holds the two engines equal on it.
func re2Pattern(pattern string) *regexp.Regexp {
	for i := 0; i < len(pattern); i++ {
		c := pattern[i]
		switch {
		case c >= 0x80 || c < 0x20 || c == '.':
			return nil
		case c == '\\':
			if i+1 >= len(pattern) || !strings.ContainsRune(`dDwWtnrf.-/\[](){}*+?|^$`, rune(pattern[i+1])) {
				return nil
			}
			i++
		case c == '(' && strings.HasPrefix(pattern[i:], "(?") && !strings.HasPrefix(pattern[i:], "(?:"):
			return nil
		case c == '[' && (strings.HasPrefix(pattern[i:], "[]") || strings.HasPrefix(pattern[i:], "[^]")):
			return nil
		}
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return nil
	}
	return re
}

// toolSchemaURL is the location the compiler files a tool's schema under.
const toolSchemaURL = "sluice:tool.json"

// compileSchema compiles a rendered tool schema (JSON Schema 2020-12)
// from its JSON text: the bytes agents are given are the bytes enforced.
// Errors name the keyword location inside the rendered document.
func compileSchema(raw []byte) (*jsonschema.Schema, error) {
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.UseRegexpEngine(compileECMA)
	c.UseLoader(noLoader{})
	if err := c.AddResource(toolSchemaURL, doc); err != nil {
		return nil, err
	}
	return c.Compile(toolSchemaURL)
}

// noLoader refuses every schema URL: a tool's schema is one document.
type noLoader struct{}

func (noLoader) Load(url string) (any, error) {
	return nil, fmt.Errorf("schema %s: only the tool's own document is loaded", url)
}

// compileLocation turns a compile error into the rendered-document
// location it happened at ("#/$defs/Pet/properties/name/pattern") and a
// short reason.
func compileLocation(err error) (string, string) {
	var sve *jsonschema.SchemaValidationError
	if errors.As(err, &sve) {
		err = sve.Err // no Unwrap: the metaschema's verdict is in Err
	}
	var ve *jsonschema.ValidationError
	if errors.As(err, &ve) {
		leaf := deepest(ve)
		loc := "#"
		for _, tok := range leaf.InstanceLocation {
			loc += "/" + pointerEscape(tok)
		}
		msg := "not a valid JSON Schema"
		if leaf.ErrorKind != nil {
			msg = leaf.ErrorKind.LocalizedString(englishPrinter)
		}
		return loc, msg
	}
	msg := err.Error()
	loc := ""
	if i := strings.Index(msg, toolSchemaURL+"#"); i >= 0 {
		rest := msg[i+len(toolSchemaURL):]
		if j := strings.IndexAny(rest, " \t\n'\""); j >= 0 {
			rest = rest[:j]
		}
		loc = rest
	}
	return loc, strings.ReplaceAll(msg, toolSchemaURL, "")
}

// deepest returns the first of the failures in e's tree that is furthest
// into the instance: under anyOf or oneOf, the branch that got furthest
// says most about what was wrong.
func deepest(e *jsonschema.ValidationError) *jsonschema.ValidationError {
	best := e
	var walk func(x *jsonschema.ValidationError)
	walk = func(x *jsonschema.ValidationError) {
		if len(x.Causes) == 0 {
			if best == e || len(x.InstanceLocation) > len(best.InstanceLocation) {
				best = x
			}
			return
		}
		for _, c := range x.Causes {
			walk(c)
		}
	}
	walk(e)
	return best
}

var englishPrinter = message.NewPrinter(language.English)

// argErrorFrom turns a validation error into an *ArgError naming the
// deepest failing field.
func argErrorFrom(err error) error {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return &ArgError{Reason: "does not match the schema"}
	}
	leaf := deepest(ve)
	loc := leaf.InstanceLocation
	reason := "does not match the schema"
	switch k := leaf.ErrorKind.(type) {
	case *kind.Required:
		if len(k.Missing) > 0 {
			loc, reason = append(slices.Clip(loc), k.Missing[0]), "required"
		}
	case *kind.AdditionalProperties:
		if len(k.Properties) > 0 {
			loc, reason = append(slices.Clip(loc), k.Properties[0]), "not a property the schema allows"
		}
	case nil:
	default:
		reason = k.LocalizedString(englishPrinter)
	}
	return &ArgError{Field: fieldName(loc), Reason: reason}
}

// fieldName renders ["body","items","2","name"] as "body.items[2].name".
func fieldName(loc []string) string {
	var b strings.Builder
	for i, part := range loc {
		if _, err := strconv.Atoi(part); err == nil && i > 0 {
			b.WriteString("[" + part + "]")
			continue
		}
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(part)
	}
	return b.String()
}

// instance is an arguments document as the compiled schema sees it.
// An empty group ("path": {}) is as good as none, as it always was: a tool
// with no path parameters is not refused for an empty path object.
func instance(args Args) map[string]any {
	doc := map[string]any{}
	if len(args.Path) > 0 {
		doc["path"] = args.Path
	}
	if len(args.Query) > 0 {
		doc["query"] = args.Query
	}
	if len(args.Headers) > 0 {
		doc["headers"] = args.Headers
	}
	if args.Body != nil {
		doc["body"] = args.Body
	}
	return doc
}
