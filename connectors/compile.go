package connectors

import (
	"bytes"
	"errors"
	"fmt"
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
type ecmaRegexp struct{ re *regexp2.Regexp }

func (e ecmaRegexp) String() string { return e.re.String() }

// MatchString fails closed: a match that times out is no match.
func (e ecmaRegexp) MatchString(s string) bool {
	ok, err := e.re.MatchString(s)
	return err == nil && ok
}

func compileECMA(pattern string) (jsonschema.Regexp, error) {
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
	return ecmaRegexp{re}, nil
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
