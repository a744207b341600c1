package connectors

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

const (
	// maxStringBytes caps any single string value in an arguments document.
	maxStringBytes = 64 << 10
	// maxArgsDepth caps nesting in an arguments document.
	maxArgsDepth = 64
)

// DecodeArgs decodes a tool-call body strictly: unknown top-level keys,
// trailing data and documents over MaxArgsBytes are *ArgError. Duplicate
// object keys at any depth and invalid UTF-8 are refused too: two parsers
// reading one document differently is how checks get bypassed. Numbers are
// kept as json.Number so that integers survive exactly.
func DecodeArgs(data []byte) (Args, error) {
	return decodeArgs(data, true)
}

// decodeArgs is DecodeArgs, with or without its fast path (a test holds
// the two to each other).
func decodeArgs(data []byte, fast bool) (Args, error) {
	if len(data) > MaxArgsBytes {
		return Args{}, &ArgError{Reason: fmt.Sprintf("document is over %d bytes", MaxArgsBytes)}
	}
	if !utf8.Valid(data) {
		return Args{}, &ArgError{Reason: "document is not valid UTF-8"}
	}
	if !fast {
		return decodeArgsTokens(data)
	}
	if args, ok := fastArgs(data); ok { // args_fast.go: the same values, in one pass
		return args, nil
	}
	return decodeArgsTokens(data)
}

// decodeArgsTokens is DecodeArgs with encoding/json's decoder, token by
// token: every document the fast path leaves alone, and every refusal.
func decodeArgsTokens(data []byte) (Args, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	tok, err := dec.Token()
	if err != nil {
		return Args{}, &ArgError{Reason: "not JSON: " + jsonReason(err)}
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return Args{}, &ArgError{Reason: "document must be a JSON object"}
	}
	var args Args
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return Args{}, &ArgError{Reason: "not JSON: " + jsonReason(err)}
		}
		key, _ := tok.(string)
		if seen[key] {
			return Args{}, &ArgError{Field: key, Reason: "duplicate key"}
		}
		seen[key] = true
		v, err := decodeValue(dec, key, 1)
		if err != nil {
			return Args{}, err
		}
		switch key {
		case "path", "query", "headers":
			if v == nil {
				continue
			}
			obj, ok := v.(map[string]any)
			if !ok {
				return Args{}, &ArgError{Field: key, Reason: "must be an object"}
			}
			switch key {
			case "path":
				args.Path = obj
			case "query":
				args.Query = obj
			default:
				args.Headers = obj
			}
		case "body":
			args.Body = v
		default:
			return Args{}, &ArgError{Field: key, Reason: "unknown key (want path, query, headers or body)"}
		}
	}
	if _, err := dec.Token(); err != nil { // the closing brace
		return Args{}, &ArgError{Reason: "not JSON: " + jsonReason(err)}
	}
	if _, err := dec.Token(); err != io.EOF {
		return Args{}, &ArgError{Reason: "trailing data after the document"}
	}
	return args, nil
}

// decodeValue reads one JSON value from dec, refusing duplicate keys.
func decodeValue(dec *json.Decoder, field string, depth int) (any, error) {
	if depth > maxArgsDepth {
		return nil, &ArgError{Field: field, Reason: fmt.Sprintf("nested deeper than %d", maxArgsDepth)}
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, &ArgError{Field: field, Reason: "not JSON: " + jsonReason(err)}
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := map[string]any{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, &ArgError{Field: field, Reason: "not JSON: " + jsonReason(err)}
				}
				k, _ := kt.(string)
				sub := field + "." + k
				if _, dup := obj[k]; dup {
					return nil, &ArgError{Field: sub, Reason: "duplicate key"}
				}
				v, err := decodeValue(dec, sub, depth+1)
				if err != nil {
					return nil, err
				}
				obj[k] = v
			}
			if _, err := dec.Token(); err != nil {
				return nil, &ArgError{Field: field, Reason: "not JSON: " + jsonReason(err)}
			}
			return obj, nil
		case '[':
			arr := []any{}
			for dec.More() {
				v, err := decodeValue(dec, field+"["+strconv.Itoa(len(arr))+"]", depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, v)
			}
			if _, err := dec.Token(); err != nil {
				return nil, &ArgError{Field: field, Reason: "not JSON: " + jsonReason(err)}
			}
			return arr, nil
		}
		return nil, &ArgError{Field: field, Reason: "not JSON"}
	default:
		return t, nil // string, json.Number, bool or nil
	}
}

// jsonReason describes a JSON syntax error without echoing the input.
func jsonReason(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return "syntax error at byte " + strconv.FormatInt(se.Offset, 10)
	}
	if err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF) {
		return "unexpected end"
	}
	return "malformed"
}

// Validate checks args against the tool's schema. A violation is *ArgError.
func (t *Tool) Validate(args Args) error {
	groups := []struct {
		key string
		in  string
		m   map[string]any
	}{{"path", "path", args.Path}, {"query", "query", args.Query}, {"headers", "header", args.Headers}}
	for _, g := range groups {
		known := map[string]*param{}
		for _, p := range t.params {
			if p.in == g.in {
				known[p.name] = p
			}
		}
		for _, name := range sortedKeys(g.m) {
			if _, ok := known[name]; !ok {
				return &ArgError{Field: g.key + "." + name, Reason: "unknown " + g.in + " parameter"}
			}
		}
		for _, p := range t.params {
			if p.in != g.in {
				continue
			}
			field := g.key + "." + p.name
			v, ok := g.m[p.name]
			if !ok || v == nil {
				if p.required {
					return &ArgError{Field: field, Reason: "required"}
				}
				continue
			}
			if err := checkStrings(v, field, g.in == "header"); err != nil {
				return err
			}
			if err := checkParamShape(p, v, field); err != nil {
				return err
			}
		}
	}

	// Exploded query objects must not pose as other parameters.
	if _, err := t.encodeQuery(args.Query); err != nil {
		return err
	}

	if t.BodyType == "" {
		if args.Body != nil {
			return &ArgError{Field: "body", Reason: "this tool takes no request body"}
		}
	} else if args.Body == nil {
		if t.bodyRequired {
			return &ArgError{Field: "body", Reason: "required"}
		}
	} else if err := t.checkBody(args.Body); err != nil {
		return err
	}
	return t.validateSchema(args)
}

// validateSchema checks the whole arguments document against the tool's
// compiled schema: the same document agents are given as Tool.Schema.
func (t *Tool) validateSchema(args Args) (err error) {
	if t.compiled == nil {
		return &ArgError{Reason: "tool has no compiled schema"}
	}
	defer func() {
		if r := recover(); r != nil {
			err = &ArgError{Reason: "schema validation failed"}
		}
	}()
	if verr := t.compiled.Validate(instance(args)); verr != nil {
		return argErrorFrom(verr)
	}
	return nil
}

// checkStrings caps every string in v and, for a header, refuses control
// characters that would split or smuggle header lines.
func checkStrings(v any, field string, header bool) error {
	switch x := v.(type) {
	case string:
		if len(x) > maxStringBytes {
			return &ArgError{Field: field, Reason: fmt.Sprintf("string is over %d bytes", maxStringBytes)}
		}
		if header && strings.ContainsAny(x, "\x00\r\n") {
			return &ArgError{Field: field, Reason: "header value contains NUL, CR or LF"}
		}
	case json.Number:
		if len(x) > maxStringBytes {
			return &ArgError{Field: field, Reason: "number is too long"}
		}
	case []any:
		for i, e := range x {
			if err := checkStrings(e, field+"["+strconv.Itoa(i)+"]", header); err != nil {
				return err
			}
		}
	case map[string]any:
		for _, k := range sortedKeys(x) {
			if len(k) > maxStringBytes {
				return &ArgError{Field: field, Reason: "key is too long"}
			}
			if err := checkStrings(x[k], field+"."+k, header); err != nil {
				return err
			}
		}
	}
	return nil
}

// dotSegmentReason explains why "." and ".." are refused as path values:
// escaping them as %2E does not help, because RFC 3986 §6.2.2.2 lets a
// normalising server decode %2E back to "." before removing dot segments
// (the trick behind CVE-2021-41773), so the value would move up a level.
const dotSegmentReason = `must not be "." or ".." (a dot segment would change which resource is addressed)`

func isDotSegment(s string) bool { return s == "." || s == ".." }

// checkParamShape refuses values the parameter's serialisation cannot carry
// faithfully, by running that serialisation: path values through pathValue
// (never empty, never a dot segment, "/" only with allowReserved), query
// values through serialise (deepObject nests; other styles take one level
// of scalars), header values as scalars or arrays of them.
func checkParamShape(p *param, v any, field string) error {
	switch p.in {
	case "path":
		_, err := pathValue(p, v, field)
		return err
	case "query":
		_, err := queryPairs(p, v, field)
		return err
	}
	if _, ok := v.(map[string]any); ok {
		return &ArgError{Field: field, Reason: "objects are not supported in " + p.in + " parameters"}
	}
	_, err := simpleValue(v, false, field)
	return err
}

func isScalar(v any) bool {
	switch v.(type) {
	case string, json.Number, bool, float64:
		return true
	}
	return false
}

// scalarString renders a scalar as it goes on the wire.
func scalarString(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case json.Number:
		return x.String()
	case bool:
		return strconv.FormatBool(x)
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64)
	}
	return ""
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
