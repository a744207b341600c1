package oauth

// The resource indicator (RFC 8707) of MCP authorization: comparing
// resources, a JWT access token's audience, the transport that names the
// resource on every authorization server request, and the redaction of
// what discovery errors quote (discover.go).

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"net/url"
	"strings"
)

// SameResource says whether two resource identifiers name the same
// resource: equal after lower-casing scheme and host, dropping a default
// port and a trailing slash (RFC 8707 2: an absolute URI without
// fragment).
func SameResource(a, b string) bool {
	na, ok1 := normResource(a)
	nb, ok2 := normResource(b)
	return ok1 && ok2 && na == nb
}

func normResource(s string) (string, bool) {
	u, err := url.Parse(s)
	if err != nil || u.Host == "" || u.Fragment != "" || u.User != nil {
		return "", false
	}
	scheme := strings.ToLower(u.Scheme)
	host := strings.ToLower(u.Hostname())
	port := u.Port()
	if (scheme == "https" && port == "443") || (scheme == "http" && port == "80") {
		port = ""
	}
	if a, err := netip.ParseAddr(host); err == nil && a.Is6() {
		host = "[" + host + "]"
	}
	if port != "" {
		host += ":" + port
	}
	return scheme + "://" + host + strings.TrimRight(u.EscapedPath(), "/") + "?" + u.RawQuery, true
}

// CheckAudience refuses a JWT access token whose aud claim does not name
// resource (RFC 8707, RFC 9068 4): a token the authorization server minted
// for another resource is never sent to this one. An opaque token (not a
// JWS compact serialisation) cannot be read and is left to the server.
// The signature is not checked: the gateway is not the token's audience;
// this guards against sending a token where it does not belong.
func CheckAudience(connector, token, resource string) error {
	parts := strings.Split(token, ".")
	if len(parts) != 3 {
		return nil
	}
	hdr, err1 := base64.RawURLEncoding.DecodeString(parts[0])
	payload, err2 := base64.RawURLEncoding.DecodeString(parts[1])
	var h struct {
		Alg string `json:"alg"`
	}
	if err1 != nil || err2 != nil || json.Unmarshal(hdr, &h) != nil || h.Alg == "" {
		return nil // not a JWT
	}
	fail := func(format string, args ...any) error {
		return &DiscoveryError{Connector: connector, Step: StepAudience, Reason: fmt.Sprintf(format, args...)}
	}
	var claims struct {
		Aud json.RawMessage `json:"aud"`
	}
	if json.Unmarshal(payload, &claims) != nil {
		return fail("the access token is a JWT whose claims cannot be read; not sent")
	}
	var auds []string
	var one string
	switch {
	case len(claims.Aud) == 0:
		return fail("the access token is a JWT without an aud claim; not sent to %s", redact(resource))
	case json.Unmarshal(claims.Aud, &one) == nil:
		auds = []string{one}
	case json.Unmarshal(claims.Aud, &auds) == nil:
	default:
		return fail("the access token's aud claim is neither a string nor an array of strings; not sent")
	}
	for _, a := range auds {
		if SameResource(a, resource) {
			return nil
		}
	}
	return fail("the access token is for audience %q, not this server %s; not sent", redactAll(auds), redact(resource))
}

func redactAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = redact(s)
	}
	return out
}

// resourceTransport adds resource= to each token request (RFC 8707 2.2)
// that does not carry it.
type resourceTransport struct {
	base     http.RoundTripper
	token    string
	resource string
}

func (t resourceTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method != http.MethodPost || req.Body == nil || !sameEndpoint(req.URL, t.token) {
		return t.base.RoundTrip(req)
	}
	b, err := io.ReadAll(io.LimitReader(req.Body, maxMetadata+1))
	req.Body.Close()
	if err != nil || len(b) > maxMetadata {
		return nil, errors.New("oauth: token request body could not be read")
	}
	form, err := url.ParseQuery(string(b))
	if err != nil {
		return nil, errors.New("oauth: token request body is not a form")
	}
	if form.Get("resource") == "" {
		form.Set("resource", t.resource)
	}
	enc := form.Encode()
	r2 := req.Clone(req.Context())
	r2.Body = io.NopCloser(strings.NewReader(enc))
	r2.ContentLength = int64(len(enc))
	r2.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(strings.NewReader(enc)), nil }
	return t.base.RoundTrip(r2)
}

func sameEndpoint(u *url.URL, endpoint string) bool {
	e, err := url.Parse(endpoint)
	return err == nil && strings.EqualFold(u.Host, e.Host) && u.Scheme == e.Scheme && u.EscapedPath() == e.EscapedPath()
}

// withQuery is raw with key=value added to its query.
func withQuery(raw, key, value string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return raw
	}
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

// redact is a URL for an error: without user info or query, bounded.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.Host != "" {
		u.User, u.RawQuery, u.Fragment = nil, "", ""
		s = u.String()
	}
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// short bounds an error's text.
func short(err error) string {
	s := err.Error()
	if len(s) > 200 {
		s = s[:200] + "…"
	}
	return s
}

// isToken says whether s is an OAuth error code (RFC 6749 A.7's
// alphabet, bounded): only such a code of a refusal is repeated.
func isToken(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}
