package connectors

import (
	"bytes"
	"context"
	"encoding/json"
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
		b, err := encodeBody(t.BodyType, args.Body)
		if err != nil {
			return nil, err
		}
		body, contentType = bytes.NewReader(b), t.BodyType
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

func (t *Tool) hasParam(in, name string) bool {
	for _, p := range t.params {
		if p.in == in && p.name == name {
			return true
		}
	}
	return false
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
		s, err := simpleValue(v, false, field)
		if err != nil {
			return "", err
		}
		if s == "" {
			return "", &ArgError{Field: field, Reason: "must not be empty"}
		}
		if isDotSegment(s) {
			return "", &ArgError{Field: field, Reason: dotSegmentReason}
		}
		b.WriteString(url.PathEscape(s))
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
// (sorted by name) following each one's style and explode.
func (t *Tool) encodeQuery(values map[string]any) (string, error) {
	var parts []string
	add := func(k, v string) { parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(v)) }
	for name := range values {
		if !t.hasParam("query", name) {
			return "", &ArgError{Field: "query." + name, Reason: "unknown query parameter"}
		}
	}
	for _, p := range t.params {
		if p.in != "query" {
			continue
		}
		v, ok := values[p.name]
		if !ok || v == nil {
			continue
		}
		field := "query." + p.name
		switch x := v.(type) {
		case []any:
			items := make([]string, 0, len(x))
			for i, e := range x {
				if !isScalar(e) {
					return "", &ArgError{Field: fmt.Sprintf("%s[%d]", field, i), Reason: "must be a string, number or boolean"}
				}
				items = append(items, scalarString(e))
			}
			if len(items) == 0 {
				continue
			}
			switch {
			case p.style == "form" && p.explode:
				for _, it := range items {
					add(p.name, it)
				}
			default:
				sep := map[string]string{"form": ",", "spaceDelimited": "%20", "pipeDelimited": "%7C"}[p.style]
				if sep == "" {
					return "", &ArgError{Field: field, Reason: "arrays are not supported in style " + p.style}
				}
				esc := make([]string, len(items))
				for i, it := range items {
					esc[i] = url.QueryEscape(it)
				}
				parts = append(parts, url.QueryEscape(p.name)+"="+strings.Join(esc, sep))
			}
		case map[string]any:
			keys := sortedKeys(x)
			for _, k := range keys {
				if !isScalar(x[k]) {
					return "", &ArgError{Field: field + "." + k, Reason: "must be a string, number or boolean"}
				}
			}
			switch {
			case p.style == "deepObject":
				for _, k := range keys {
					add(p.name+"["+k+"]", scalarString(x[k]))
				}
			case p.style == "form" && p.explode:
				for _, k := range keys {
					add(k, scalarString(x[k]))
				}
			case p.style == "form":
				esc := make([]string, 0, 2*len(keys))
				for _, k := range keys {
					esc = append(esc, url.QueryEscape(k), url.QueryEscape(scalarString(x[k])))
				}
				parts = append(parts, url.QueryEscape(p.name)+"="+strings.Join(esc, ","))
			default:
				return "", &ArgError{Field: field, Reason: "objects are not supported in style " + p.style}
			}
		default:
			if !isScalar(v) {
				return "", &ArgError{Field: field, Reason: "unsupported value"}
			}
			add(p.name, scalarString(v))
		}
	}
	return strings.Join(parts, "&"), nil
}

// encodeBody serialises the body as JSON or as a form. A form body is an
// object: scalars become strings, arrays repeat their key (as Twilio expects
// for, e.g., StatusCallbackEvent), and a nested object is sent as JSON text.
func encodeBody(mediaType string, body any) ([]byte, error) {
	if mediaType != formType {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, &ArgError{Field: "body", Reason: "cannot encode as JSON"}
		}
		return b, nil
	}
	obj, ok := body.(map[string]any)
	if !ok {
		return nil, &ArgError{Field: "body", Reason: "a form body must be an object"}
	}
	var parts []string
	for _, k := range sortedKeys(obj) {
		switch x := obj[k].(type) {
		case nil:
		case []any:
			for i, e := range x {
				if !isScalar(e) {
					return nil, &ArgError{Field: fmt.Sprintf("body.%s[%d]", k, i), Reason: "form arrays hold only strings, numbers or booleans"}
				}
				parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(scalarString(e)))
			}
		case map[string]any:
			b, err := json.Marshal(x)
			if err != nil {
				return nil, &ArgError{Field: "body." + k, Reason: "cannot encode as JSON"}
			}
			parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(string(b)))
		default:
			parts = append(parts, url.QueryEscape(k)+"="+url.QueryEscape(scalarString(x)))
		}
	}
	return []byte(strings.Join(parts, "&")), nil
}
