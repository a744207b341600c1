package connectors

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

const formType = "application/x-www-form-urlencoded"

// NewRequest builds the upstream request for validated args against base.
// Path parameters are escaped so that no value can change the path's
// segments ("../", "%2e%2e%2f" and "/" stay inside one segment).
//
// It checks again what Validate checked about the request's shape (every
// placeholder filled, no empty path value, no CR/LF/NUL in a header) so that
// a caller that skipped Validate still cannot build a request that escapes
// its path or splits its headers. It attaches no credential.
func (t *Tool) NewRequest(ctx context.Context, base *url.URL, args Args) (*http.Request, error) {
	if base == nil || !base.IsAbs() || base.Host == "" || (base.Scheme != "http" && base.Scheme != "https") {
		return nil, errors.New("connectors: new request: base URL must be an absolute http(s) URL")
	}
	escPath, err := t.escapedPath(base, args.Path)
	if err != nil {
		return nil, err
	}
	plain, err := url.PathUnescape(escPath)
	if err != nil {
		return nil, fmt.Errorf("connectors: new request: bug(): path does not unescape: %w", err)
	}
	u := &url.URL{Scheme: base.Scheme, Host: base.Host, Path: plain, RawPath: escPath}
	if u.EscapedPath() != escPath {
		return nil, errors.New("connectors: new request: bug(): path escaping is not stable")
	}
	u.RawQuery, err = t.encodeQuery(args.Query)
	if err != nil {
		return nil, err
	}
	if t.fixedQuery != "" {
		u.RawQuery = strings.TrimSuffix(t.fixedQuery+"&"+u.RawQuery, "&")
	}

	var body io.Reader
	contentType := ""
	if args.Body != nil {
		if t.BodyType == "" {
			return nil, &ArgError{Field: "body", Reason: "this tool takes no request body"}
		}
		c := t.codec
		if c == nil {
			c = &bodyCodec{}
		}
		b, ct, err := c.encode(args.Body)
		if err != nil {
			return nil, err
		}
		body, contentType = bytes.NewReader(b), ct
	}
	req, err := http.NewRequestWithContext(ctx, t.Method, u.String(), body)
	if err != nil {
		return nil, fmt.Errorf("connectors: new request: %w", err)
	}
	// Keep our URL as built: re-parsing must not have normalised the path.
	if req.URL.EscapedPath() != escPath {
		return nil, errors.New("connectors: new request: bug(): path changed when parsed")
	}
	req.URL = u
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for _, p := range t.params {
		if p.in != "header" {
			continue
		}
		v, ok := args.Headers[p.name]
		if !ok || v == nil {
			continue
		}
		s, err := simpleValue(v, p.explode, "headers."+p.name)
		if err != nil {
			return nil, err
		}
		if strings.ContainsAny(s, "\x00\r\n") {
			return nil, &ArgError{Field: "headers." + p.name, Reason: "header value contains NUL, CR or LF"}
		}
		req.Header.Set(p.name, s)
	}
	for name := range args.Headers {
		if !t.hasParam("header", name) {
			return nil, &ArgError{Field: "headers." + name, Reason: "unknown header parameter"}
		}
	}
	return req, nil
}

func (t *Tool) hasParam(in, name string) bool { return t.param(in, name) != nil }

func (t *Tool) param(in, name string) *param {
	for _, p := range t.params {
		if p.in == in && p.name == name {
			return p
		}
	}
	return nil
}

// pathValue serialises and escapes one path value (style simple). Without
// allowReserved the value is exactly one segment: url.PathEscape escapes
// "/", "?", "#", "%" and ";". With allowReserved it may span segments
// separated by "/" (GitHub's contents/{path}), each checked by
// checkReservedPath; either way "." and ".." are refused, not escaped.
func pathValue(p *param, v any, field string) (string, error) {
	s, err := simpleValue(v, false, field)
	if err != nil {
		return "", err
	}
	if s == "" {
		return "", &ArgError{Field: field, Reason: "must not be empty"}
	}
	if !p.reserved {
		if isDotSegment(s) {
			return "", &ArgError{Field: field, Reason: dotSegmentReason}
		}
		return url.PathEscape(s), nil
	}
	if err := checkReservedPath(s, field); err != nil {
		return "", err
	}
	segs := strings.Split(s, "/")
	for i, seg := range segs {
		segs[i] = url.PathEscape(seg)
	}
	return strings.Join(segs, "/"), nil
}

// maxUnescapeRounds is how many layers of percent-encoding are peeled off
// a path value to look for a hidden dot segment or separator.
const maxUnescapeRounds = 4

// checkReservedPath refuses an allowReserved path value that could leave
// its place in the path: an empty segment ("//", or a leading or trailing
// "/"), a "." or ".." segment, one hidden under percent-encoding ("%2e%2e",
// ".%2e", "%252e": CVE-2021-41773 and CVE-2021-42013), a backslash (read as
// "/" by some servers), "?" or "#", or a control character.
func checkReservedPath(s, field string) error {
	if strings.ContainsAny(s, "\\?#") {
		return &ArgError{Field: field, Reason: `must not hold "\", "?" or "#"`}
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return &ArgError{Field: field, Reason: "must not hold control characters"}
		}
	}
	for _, seg := range strings.Split(s, "/") {
		if seg == "" {
			return &ArgError{Field: field, Reason: "must not hold an empty segment (a leading, trailing or doubled /)"}
		}
		dec := seg
		for round := 0; ; round++ {
			for _, part := range strings.FieldsFunc(dec, func(r rune) bool { return r == '/' || r == '\\' }) {
				if isDotSegment(part) {
					return &ArgError{Field: field, Reason: dotSegmentReason}
				}
			}
			if round > 0 && (strings.ContainsAny(dec, "/\\") || strings.ContainsRune(dec, 0)) {
				return &ArgError{Field: field, Reason: "must not hold a percent-encoded /, \\ or NUL"}
			}
			next, err := url.PathUnescape(dec)
			if err != nil || next == dec || round == maxUnescapeRounds {
				break
			}
			dec = next
		}
	}
	return nil
}

// escapedPath fills the path template. Each value becomes exactly one
// segment: url.PathEscape escapes "/", "?", "#", "%" and ";", and a value
// that is "." or ".." is written as %2E or %2E%2E so that no client, proxy or
// server normalising dot segments (RFC 3986 §5.2.4) moves up a level.
func (t *Tool) escapedPath(base *url.URL, values map[string]any) (string, error) {
	var b strings.Builder
	b.WriteString(strings.TrimRight(base.EscapedPath(), "/"))
	rest := t.PathTemplate
	used := 0
	for {
		i := strings.IndexByte(rest, '{')
		if i < 0 {
			b.WriteString(escapeLiteral(rest))
			break
		}
		j := strings.IndexByte(rest[i:], '}')
		if j < 0 {
			return "", fmt.Errorf("connectors: new request: bug(): bad path template %q", t.PathTemplate)
		}
		b.WriteString(escapeLiteral(rest[:i]))
		name := rest[i+1 : i+j]
		field := "path." + name
		v, ok := values[name]
		if !ok || v == nil {
			return "", &ArgError{Field: field, Reason: "required"}
		}
		used++
		p := t.param("path", name)
		if p == nil {
			return "", fmt.Errorf("connectors: new request: bug(): {%s} has no path parameter", name)
		}
		esc, err := pathValue(p, v, field)
		if err != nil {
			return "", err
		}
		b.WriteString(esc)
		rest = rest[i+j+1:]
	}
	if used != len(values) {
		for name := range values {
			if !t.hasParam("path", name) {
				return "", &ArgError{Field: "path." + name, Reason: "unknown path parameter"}
			}
		}
	}
	return b.String(), nil
}

// escapeLiteral escapes the fixed parts of a template, keeping their slashes.
func escapeLiteral(s string) string {
	return (&url.URL{Path: s}).EscapedPath()
}

// simpleValue serialises a path or header value (style simple): arrays are
// comma-joined.
func simpleValue(v any, _ bool, field string) (string, error) {
	switch x := v.(type) {
	case []any:
		parts := make([]string, 0, len(x))
		for i, e := range x {
			if !isScalar(e) {
				return "", &ArgError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: "must be a string, number or boolean"}
			}
			parts = append(parts, scalarString(e))
		}
		return strings.Join(parts, ","), nil
	default:
		if !isScalar(v) {
			return "", &ArgError{Field: field, Reason: "must be a string, number, boolean or array of them"}
		}
		return scalarString(v), nil
	}
}

// encodeQuery serialises query parameters in the tool's parameter order
// (sorted by name) following each one's style and explode; see serialise.
func (t *Tool) encodeQuery(values map[string]any) (string, error) {
	for name := range values {
		if !t.hasParam("query", name) {
			return "", &ArgError{Field: "query." + name, Reason: "unknown query parameter"}
		}
	}
	declared := map[string]bool{}
	for _, p := range t.params {
		if p.in == "query" {
			declared[p.name] = true
		}
	}
	var all [][]pair
	var esc []func(string) string
	for _, p := range t.params {
		v, ok := values[p.name]
		if p.in != "query" || !ok || v == nil {
			continue
		}
		ps, err := queryPairs(p, v, "query."+p.name)
		if err != nil {
			return "", err
		}
		all = append(all, ps)
		e := url.QueryEscape
		if p.reserved {
			e = escapeReserved
		}
		esc = append(esc, e)
	}
	if err := checkCollisions(all, declared, "query"); err != nil {
		return "", err
	}
	parts := make([]string, 0, len(all))
	for i, ps := range all {
		if len(ps) > 0 {
			parts = append(parts, writePairs(ps, esc[i]))
		}
	}
	return strings.Join(parts, "&"), nil
}

func queryPairs(p *param, v any, field string) ([]pair, error) {
	return serialise(p.name, v, style{name: p.style, explode: p.explode, declared: true}, field)
}
