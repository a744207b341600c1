package extauthz

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Request is a CheckRequest as the gateway decides it: the identity Envoy
// vouches for, and the request Envoy will send if the answer is allow.
// Nothing in it is normalised into something Envoy would not send: a
// request whose target or authority is not already in canonical form is
// refused (Parse), because Envoy forwards what it received, not what the
// gateway would have normalised it to.
type Request struct {
	ID       string        // Envoy's request id (x-request-id), for the log only
	Identity wire.Identity // from the source principal or context_extensions, never headers
	// IdentitySource is "principal" or "context_extensions".
	IdentitySource string
	Protocol       string // "HTTP/1.1", "HTTP/2", …
	Scheme         string // "http" or "https": the downstream scheme
	Method         string // upper case
	Host           string // canonical: lower case, no port, no trailing dot
	Port           int    // the authority's port, else the scheme's
	// ExplicitPort: the authority named the port.
	ExplicitPort bool
	Path         string // the request target's path ("" for CONNECT)
	RawQuery     string // as sent, without '?'
	Query        url.Values
	Headers      http.Header // as Envoy reported them, pseudo-headers left out
	Body         []byte      // what Envoy buffered (with_request_body); may be partial
	// BodyTruncated: Envoy sent less than the request's Content-Length
	// (max_request_bytes with allow_partial_message).
	BodyTruncated bool
	// BodySHA256 is the hex SHA-256 of Body; a hold is bound to it.
	BodySHA256 string
	// Envoy is the request in opa-envoy-plugin's input shape, for
	// input.envoy: EnvoyJSON's encoding of EnvoyInput.
	Envoy json.RawMessage
}

// Target is the request's URL as Envoy will send it upstream
// (scheme://host[:port]/path?query); for CONNECT, host:port.
func (r *Request) Target() string {
	if r.Method == http.MethodConnect {
		return net.JoinHostPort(r.Host, strconv.Itoa(r.Port))
	}
	u := r.Scheme + "://" + net.JoinHostPort(r.Host, strconv.Itoa(r.Port)) + r.Path
	if r.RawQuery != "" {
		u += "?" + r.RawQuery
	}
	return u
}

// BadRequestError is a CheckRequest whose request cannot be decided as
// sent: the reason names the part at fault.
type BadRequestError struct{ Reason string }

func (e *BadRequestError) Error() string { return "extauthz: bad request: " + e.Reason }

func bad(format string, args ...any) error {
	return &BadRequestError{Reason: fmt.Sprintf(format, args...)}
}

// Parse turns a CheckRequest's HTTP attributes into a Request. It does not
// set the identity (Identify does). It refuses, with *BadRequestError:
// a missing HTTP request; an authority that is not canonical (what Envoy
// sends upstream must be what was decided: "2130706433" means 127.0.0.1
// to a resolver, so it is refused rather than decided as a name); a
// request target with dot-segments, empty segments, encoded '/', '\' or
// '.', a fragment, control characters or bad percent-encoding (RFC 3986
// §6.2.2: those are the forms a path can hide another path in).
func Parse(cr *authv3.CheckRequest) (*Request, error) {
	h := cr.GetAttributes().GetRequest().GetHttp()
	if h == nil {
		return nil, bad("no HTTP request in attributes.request.http (only the HTTP ext_authz filter is served)")
	}
	r := &Request{
		ID:       h.GetId(),
		Protocol: h.GetProtocol(),
		Scheme:   strings.ToLower(h.GetScheme()),
		Method:   strings.ToUpper(h.GetMethod()),
		Headers:  http.Header{},
	}
	if r.Method == "" || strings.IndexFunc(r.Method, func(c rune) bool { return c < 'A' || c > 'Z' }) >= 0 {
		return nil, bad("method %q", h.GetMethod())
	}
	switch r.Scheme {
	case "":
		r.Scheme = "http"
	case "http", "https":
	default:
		return nil, bad("scheme %q: want http or https", h.GetScheme())
	}
	if hm := h.GetHeaderMap(); hm != nil && len(h.GetHeaders()) == 0 {
		for _, hv := range hm.GetHeaders() {
			v := hv.GetValue()
			if len(hv.GetRawValue()) > 0 {
				v = string(hv.GetRawValue())
			}
			r.Headers.Add(hv.GetKey(), v)
		}
	} else {
		for k, v := range h.GetHeaders() {
			r.Headers.Set(k, v)
		}
	}
	for k := range r.Headers {
		if strings.HasPrefix(k, ":") {
			delete(r.Headers, k)
		}
	}

	// Authority: Envoy's host is :authority (HTTP/2) or Host (HTTP/1.1);
	// for CONNECT it is the tunnel's target and must carry a port.
	defPort := "80"
	if r.Scheme == "https" {
		defPort = "443"
	}
	if r.Method == http.MethodConnect {
		defPort = ""
	}
	host, port, err := guard.ParseAuthority(h.GetHost(), defPort)
	if err != nil {
		var ae *guard.AuthorityError
		if errors.As(err, &ae) {
			return nil, bad("host %q: %s", h.GetHost(), ae.Reason)
		}
		return nil, bad("host %q", h.GetHost())
	}
	// The authority exactly as sent must be the canonical one: case, a
	// trailing dot or another spelling of an address could name a
	// different virtual host or address to whoever reads it next (F4).
	sent := hostOnly(h.GetHost())
	if a, perr := netip.ParseAddr(sent); perr == nil && strings.Contains(sent, ":") {
		sent = a.String() // IPv6 has many spellings; netip's is the canonical one
	}
	if sent != host {
		return nil, bad("host %q: not in canonical form (it means %s); send that", h.GetHost(), host)
	}
	r.Host = host
	r.Port, _ = strconv.Atoi(port)
	_, _, perr := net.SplitHostPort(h.GetHost())
	r.ExplicitPort = perr == nil

	if r.Method == http.MethodConnect {
		if p := h.GetPath(); p != "" && p != h.GetHost() {
			return nil, bad("CONNECT with a path %q", p)
		}
	} else {
		path, query, err := splitTarget(h.GetPath())
		if err != nil {
			return nil, err
		}
		r.Path, r.RawQuery = path, query
		if r.Query, err = url.ParseQuery(query); err != nil {
			return nil, bad("query: %v", err)
		}
	}

	body := h.GetRawBody()
	if len(body) == 0 && h.GetBody() != "" {
		body = []byte(h.GetBody())
	}
	r.Body = body
	if cl := r.Headers.Get("Content-Length"); cl != "" {
		if n, err := strconv.ParseInt(cl, 10, 64); err == nil && n > int64(len(body)) {
			r.BodyTruncated = true
		}
	}
	sum := sha256.Sum256(body)
	r.BodySHA256 = hex.EncodeToString(sum[:])
	return r, nil
}

// hostOnly strips a port from an authority, keeping IPv6 brackets' content.
func hostOnly(a string) string {
	if strings.HasPrefix(a, "[") {
		if i := strings.Index(a, "]"); i > 0 {
			return a[1:i]
		}
		return a
	}
	if i := strings.LastIndexByte(a, ':'); i >= 0 {
		return a[:i]
	}
	return a
}

// splitTarget checks an origin-form request target and splits it into path
// and raw query.
func splitTarget(t string) (path, query string, err error) {
	if t == "" || t[0] != '/' {
		return "", "", bad("path %q: want an origin-form target starting with /", t)
	}
	for i := 0; i < len(t); i++ {
		if c := t[i]; c <= 0x20 || c >= 0x7f || c == '#' || c == '\\' {
			return "", "", bad("path: byte 0x%02x at %d is not allowed in a request target", c, i)
		}
	}
	path, query, _ = strings.Cut(t, "?")
	for i := 0; i < len(path); i++ {
		if path[i] != '%' {
			continue
		}
		if i+2 >= len(path) || !isHex(path[i+1]) || !isHex(path[i+2]) {
			return "", "", bad("path %q: bad percent-encoding at %d", path, i)
		}
		switch strings.ToLower(path[i+1 : i+3]) {
		case "2f", "5c", "2e", "00":
			return "", "", bad("path %q: encoded '/', '\\', '.' or NUL (%s) hides a path in a segment", path, path[i:i+3])
		}
	}
	for i, seg := range strings.Split(path[1:], "/") {
		switch {
		case seg == "." || seg == "..":
			return "", "", bad("path %q: dot-segment %q (RFC 3986 §5.2.4)", path, seg)
		case seg == "" && i < strings.Count(path[1:], "/"):
			return "", "", bad("path %q: empty segment (//)", path)
		}
	}
	return path, query, nil
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}
