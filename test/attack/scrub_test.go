//go:build linux

package attack

import (
	"archive/zip"
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"path"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// reflectForm is one way a hostile (or careless) upstream hands the
// credential it was sent back to the caller.
type reflectForm struct {
	name  string
	what  string                                    // the threat, for the casebook
	build func(secret string) (http.Header, []byte) // the reply's header and body
	// reason is the scrub.ReplyError reason of a reply that must be
	// refused (502 upstream_error); "" means relayed with the secret
	// replaced (200, audited secret_reflected).
	reason string
}

// expected is the designed outcome of f, for the casebook.
func (f reflectForm) expected() string {
	if f.reason != "" {
		return "502 upstream_error, nothing relayed; audit result upstream_error=" + f.reason
	}
	return "200 with the secret replaced; audit secret_reflected; the upstream was asked for Accept-Encoding: identity"
}

// packed is b written through the compressor mk makes.
func packed(b []byte, mk func(io.Writer) io.WriteCloser) []byte {
	var buf bytes.Buffer
	w := mk(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

func gzipped(b []byte) []byte {
	return packed(b, func(w io.Writer) io.WriteCloser { return gzip.NewWriter(w) })
}

func zlibbed(b []byte) []byte {
	return packed(b, func(w io.Writer) io.WriteCloser { return zlib.NewWriter(w) })
}

func zipped(name string, b []byte) []byte {
	var buf bytes.Buffer
	z := zip.NewWriter(&buf)
	f, _ := z.Create(name)
	_, _ = f.Write(b)
	_ = z.Close()
	return buf.Bytes()
}

func echoJSON(secret string) []byte { return []byte(`{"echo":"` + secret + `","ok":true}`) }

func jsonType() http.Header { return http.Header{"Content-Type": {"application/json"}} }

// escapeJSON spells every byte of s as \uXXXX, upper-case hex.
func escapeJSON(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, `\u%04X`, s[i])
	}
	return b.String()
}

// percentAll percent-encodes every byte of s.
func percentAll(s, format string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		fmt.Fprintf(&b, format, s[i])
	}
	return b.String()
}

// inBase64 is the base64 of shift bytes, the secret and a tail: the
// secret at each of the three byte alignments inside a longer blob.
func inBase64(enc *base64.Encoding, shift int, secret string) string {
	return enc.EncodeToString([]byte(strings.Repeat("u", shift) + ":" + secret + "@tail"))
}

var reflectForms = []reflectForm{
	{"ce-identity-then-gzip", "two Content-Encoding lines, identity then gzip, gzip body",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"identity", "gzip"}}, gzipped(echoJSON(s))
		}, ""},
	{"ce-gzip-identity", "Content-Encoding: gzip, identity (one line, two members)",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip, identity"}}, gzipped(echoJSON(s))
		}, ""},
	{"ce-gzip-gzip", "Content-Encoding gzip on two lines, body gzipped twice",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Encoding": {"gzip", "gzip"}}, gzipped(gzipped(echoJSON(s)))
		}, ""},
	{"ce-deflate", "Content-Encoding: deflate (zlib)",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Encoding": {"deflate"}}, zlibbed(echoJSON(s))
		}, ""},
	{"ce-identity-then-br", "Content-Encoding lines identity then br (a coding the gateway cannot undo)",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Encoding": {"identity", "br"}}, echoJSON(s)
		}, "encoded_reply"},
	{"ce-unknown", "Content-Encoding: x-custom",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Encoding": {"x-custom"}}, echoJSON(s)
		},
		"encoded_reply"},
	{"gzip-no-coding", "a gzip body labelled application/json, no Content-Encoding",
		func(s string) (http.Header, []byte) { return jsonType(), gzipped(echoJSON(s)) }, "opaque_reply"},
	{"application-gzip", "Content-Type: application/gzip, gzip body",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Type": {"application/gzip"}}, gzipped(echoJSON(s))
		}, "opaque_reply"},
	{"zip-archive", "a zip archive (deflated member) as application/octet-stream",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Type": {"application/octet-stream"}}, zipped("key.txt", echoJSON(s))
		}, "opaque_reply"},
	{"zlib-no-coding", "a zlib stream with no Content-Encoding",
		func(s string) (http.Header, []byte) { return http.Header{}, zlibbed(echoJSON(s)) }, "opaque_reply"},
	{"json-u", "JSON string with every byte of the secret as \\uXXXX",
		func(s string) (http.Header, []byte) { return jsonType(), []byte(`{"echo":"` + escapeJSON(s) + `"}`) }, ""},
	{"json-u-key", "the secret \\u-escaped as a JSON object key",
		func(s string) (http.Header, []byte) { return jsonType(), []byte(`{"` + escapeJSON(s) + `":1}`) }, ""},
	{"percent-upper", "full percent-encoding, %XX upper case",
		func(s string) (http.Header, []byte) {
			return http.Header{}, []byte("logged: q=" + percentAll(s, "%%%02X"))
		}, ""},
	{"percent-lower", "full percent-encoding, %xx lower case",
		func(s string) (http.Header, []byte) {
			return http.Header{}, []byte("logged: q=" + percentAll(s, "%%%02x"))
		}, ""},
	{"upper-case", "the secret upper-cased by an error page",
		func(s string) (http.Header, []byte) {
			return http.Header{"Content-Type": {"text/html"}}, []byte("<h1>401 BAD TOKEN " + strings.ToUpper(s) + "</h1>")
		}, ""},
	{"html-references", "the secret as HTML decimal character references",
		func(s string) (http.Header, []byte) {
			var b strings.Builder
			for i := 0; i < len(s); i++ {
				fmt.Fprintf(&b, "&#%d;", s[i])
			}
			return http.Header{"Content-Type": {"text/html"}}, []byte("<p>" + b.String() + "</p>")
		}, ""},
	{"header-name-and-value", "the secret as a header name and in a header value",
		func(s string) (http.Header, []byte) {
			return http.Header{"X-" + s: {"1"}, "X-Echo": {"got " + s}}, []byte("ok")
		}, ""},
	{"content-length", "the raw secret in a body whose Content-Length is the upstream's",
		func(s string) (http.Header, []byte) { return http.Header{}, []byte("token=" + s + "\n") }, ""},
}

func init() {
	// Base64 in both alphabets, padded or not, and the secret at each of
	// the three byte alignments inside a longer blob.
	for _, e := range []struct {
		name string
		enc  *base64.Encoding
	}{{"std", base64.StdEncoding}, {"std-raw", base64.RawStdEncoding}, {"url", base64.URLEncoding}, {"url-raw", base64.RawURLEncoding}} {
		enc := e.enc
		reflectForms = append(reflectForms, reflectForm{"base64-" + e.name, "base64 (" + e.name + ") of the secret",
			func(s string) (http.Header, []byte) {
				return jsonType(), []byte(`{"b":"` + enc.EncodeToString([]byte(s)) + `"}`)
			}, ""})
		for shift := range 3 {
			reflectForms = append(reflectForms, reflectForm{fmt.Sprintf("base64-%s-align%d", e.name, shift),
				fmt.Sprintf("the secret %d+1 bytes into a longer base64 (%s) blob", shift, e.name),
				func(s string) (http.Header, []byte) {
					return jsonType(), []byte(`{"blob":"` + inBase64(enc, shift, s) + `"}`)
				}, ""})
		}
	}
}

func formNamed(name string) (reflectForm, bool) {
	for _, f := range reflectForms {
		if f.name == name {
			return f, true
		}
	}
	return reflectForm{}, false
}

// reflectReply answers GET /reflect/{form} on the world's TLS upstream:
// the bearer credential it received, in that form.
func reflectReply(rw http.ResponseWriter, r *http.Request) {
	f, ok := formNamed(path.Base(r.URL.Path))
	if !ok {
		http.NotFound(rw, r)
		return
	}
	h, body := f.build(strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
	for k, vs := range h {
		rw.Header()[k] = vs
	}
	rw.Header().Set("Content-Length", strconv.Itoa(len(body)))
	_, _ = rw.Write(body)
}

// rawReply is the same reply as bytes, for the connector upstream's
// ModeRaw.
func rawReply(f reflectForm, secret string) string {
	h, body := f.build(secret)
	var b strings.Builder
	b.WriteString("HTTP/1.1 200 OK\r\n")
	names := make([]string, 0, len(h))
	for k := range h {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		for _, v := range h[k] {
			b.WriteString(k + ": " + v + "\r\n")
		}
	}
	fmt.Fprintf(&b, "Content-Length: %d\r\nConnection: close\r\n\r\n", len(body))
	b.Write(body)
	return b.String()
}

// echoHeaders answers GET /headers with the names of the fields it
// received, sorted, one a line.
func echoHeaders(rw http.ResponseWriter, r *http.Request) {
	names := make([]string, 0, len(r.Header))
	for k := range r.Header {
		names = append(names, k)
	}
	sort.Strings(names)
	_, _ = io.WriteString(rw, strings.Join(names, "\n"))
}

var (
	b64Run = regexp.MustCompile(`[A-Za-z0-9+/_-]{12,}`)
	hexRun = regexp.MustCompile(`[0-9A-Fa-f]{16,}`)
	jsonJS = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`)
)

// recovered says how the secret can be got back from any of parts (a
// reply's header, its body) as the sandbox received them ("" if it
// cannot): an oracle written with the standard library's decoders,
// independent of the gateway's scrubber. Each part is tried as sent,
// decompressed (gzip, also nested, zlib, zip), and every base64 run of it
// decoded and decompressed in turn; each of those as text, HTML-unescaped,
// percent-decoded, with its JSON strings decoded, and with its hex runs
// decoded.
func recovered(secret string, parts ...[]byte) string {
	cands := map[string][]byte{}
	var expand func(name string, b []byte, depth int)
	expand = func(name string, b []byte, depth int) {
		cands[name] = b
		if depth > 2 {
			return
		}
		if zr, err := gzip.NewReader(bytes.NewReader(b)); err == nil {
			d, _ := io.ReadAll(zr)
			expand(name+" gunzip", d, depth+1)
		}
		if zr, err := zlib.NewReader(bytes.NewReader(b)); err == nil {
			d, _ := io.ReadAll(zr)
			expand(name+" zlib", d, depth+1)
		}
		if zr, err := zip.NewReader(bytes.NewReader(b), int64(len(b))); err == nil {
			for _, f := range zr.File {
				if rc, err := f.Open(); err == nil {
					d, _ := io.ReadAll(rc)
					expand(name+" unzip", d, depth+1)
				}
			}
		}
		for i, run := range b64Run.FindAll(b, -1) {
			for off := range 4 {
				if off >= len(run) {
					break
				}
				r := run[off:]
				r = r[:len(r)/4*4]
				for _, enc := range []*base64.Encoding{base64.RawStdEncoding, base64.RawURLEncoding} {
					if d, err := enc.DecodeString(string(r)); err == nil {
						expand(fmt.Sprintf("%s base64 run %d+%d", name, i, off), d, depth+1)
					}
				}
			}
		}
	}
	for i, p := range parts {
		expand(fmt.Sprintf("part %d", i), p, 0)
	}
	low := strings.ToLower(secret)
	for name, c := range cands {
		texts := map[string][]byte{"": c, " html-unescaped": []byte(html.UnescapeString(string(c))), " percent-decoded": percentDecode(c)}
		var js []byte
		for _, lit := range jsonJS.FindAll(c, -1) {
			var v string
			if json.Unmarshal(lit, &v) == nil {
				js = append(append(js, v...), '\n')
			}
		}
		texts[" json strings"] = js
		var hx []byte
		for _, run := range hexRun.FindAll(c, -1) {
			for off := range 2 {
				r := run[off:]
				if d, err := hex.DecodeString(string(r[:len(r)/2*2])); err == nil {
					hx = append(append(hx, d...), '\n')
				}
			}
		}
		texts[" hex runs"] = hx
		for how, t := range texts {
			if strings.Contains(strings.ToLower(string(t)), low) {
				return name + how
			}
		}
	}
	return ""
}

func percentDecode(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] == '%' && i+2 < len(b) {
			if v, err := strconv.ParseUint(string(b[i+1:i+3]), 16, 8); err == nil {
				out = append(out, byte(v))
				i += 2
				continue
			}
		}
		out = append(out, b[i])
	}
	return out
}

// dump is a reply's header as the sandbox got it.
func dump(h http.Header) []byte {
	var b bytes.Buffer
	_ = h.Write(&b)
	return b.Bytes()
}

// TestReflectedEncodings is THREATS D11 through the real binary: an
// upstream reflects the credential the gateway attached in every form of
// reflectForms, under TLS interception (the placeholder's secret) and on
// the tool path (the connector's API key). The sandbox must never be able
// to recover the secret with any standard decoder: either the reply is
// relayed with the secret replaced (200, audited secret_reflected) or it
// is refused (502 upstream_error, audited with the reason). The upstream
// must have been asked for an uncoded reply (Accept-Encoding: identity,
// whatever the sandbox asked for), and the Content-Length the sandbox sees
// is the body it got, never the upstream's.
func TestReflectedEncodings(t *testing.T) {
	w := newWorld(t)
	c := w.proxyClient(agentA, w.gatewayCA)
	g := w.g.For(t)
	for _, f := range reflectForms {
		t.Run("intercepted "+f.name, func(t *testing.T) {
			cb := casebook.Expect(t, "D11", "intercepted https://api.test: "+f.what, f.expected())
			before := len(g.AuditEvent("secret_reflected", `"dest_host":"api.test"`))
			// A hostile sandbox asks for compression itself.
			hdr := http.Header{"Authorization": {"Bearer " + w.placeholder}, "Accept-Encoding": {"gzip, br, zstd"}}
			st, body, rh := w.fetch(t, c, http.MethodGet, "https://api.test/reflect/"+f.name, "", hdr)
			seen := w.tlsRequests()[len(w.tlsRequests())-1]
			leak := recovered(w.ghSecret, dump(rh), []byte(body))
			ae := seen.hdr.Values("Accept-Encoding")
			var audited bool
			if f.reason == "" {
				audited = w.awaitAuditCount(t, "secret_reflected", `"dest_host":"api.test"`, before+1)
			} else {
				audited = w.awaitAudit(t, "result", `"upstream_error":"`+f.reason+`"`, requestID(body))
			}
			cb.Observef("%s, upstream got the secret %v and Accept-Encoding %q, sandbox recovers the secret: %q, Content-Length %q for %d bytes, audited %v",
				statusText(st, errCode(body)), seen.auth == "Bearer "+w.ghSecret, ae, leak, rh.Get("Content-Length"), len(body), audited)
			if seen.auth != "Bearer "+w.ghSecret {
				t.Fatalf("the upstream did not get the secret (%q): the case proves nothing", seen.auth)
			}
			if f.reason == "" && !strings.Contains(string(dump(rh))+body, "redacted-by-sluice") && f.name != "header-name-and-value" {
				t.Errorf("no replacement in %q", body)
			}
			reflectOutcome{status: st, code: errCode(body), ae: ae, leak: leak, audited: audited,
				coding: rh.Values("Content-Encoding"), length: rh.Values("Content-Length"), bodyLen: len(body)}.check(t, f)
		})
	}
	for _, f := range reflectForms {
		t.Run("tool call "+f.name, func(t *testing.T) {
			cb := casebook.Expect(t, "D11", "tool call tickets.list_tickets, the upstream answers with "+f.what, f.expected())
			w.e.Up.SetRaw(rawReply(f, w.e.Secret))
			t.Cleanup(func() { w.e.Up.SetMode(gwenv.ModeOK) })
			r := g.Call(agentA, "tickets.list_tickets", "{}")
			reqs := w.e.Up.Requests()
			seen := reqs[len(reqs)-1].Header
			leak := recovered(w.e.Secret, r.Raw, r.Result.Body)
			var audited bool
			if f.reason == "" {
				audited = len(g.AuditEvent("secret_reflected", r.RequestID)) == 1
			} else {
				audited = w.awaitAudit(t, "result", `"upstream_error":"`+f.reason+`"`, r.RequestID)
			}
			cb.Observef("%s (result %d), upstream got the key %v and Accept-Encoding %q, sandbox recovers the secret: %q, audited %v",
				statusText(r.Status, r.Code), r.Result.Status, seen.Get("X-Api-Key") == w.e.Secret, seen.Values("Accept-Encoding"), leak, audited)
			if seen.Get("X-Api-Key") != w.e.Secret {
				t.Fatal("the upstream did not get the key: the case proves nothing")
			}
			if r.RequestID == "" || f.reason == "" && r.Result.Status != http.StatusOK {
				t.Errorf("result %d, request id %q: %s", r.Result.Status, r.RequestID, r.Body)
			}
			reflectOutcome{status: r.Status, code: r.Code, ae: seen.Values("Accept-Encoding"), leak: leak, audited: audited,
				coding: r.Result.Headers["Content-Encoding"], length: r.Result.Headers["Content-Length"], bodyLen: resultLen(r.Result.Body)}.check(t, f)
		})
	}
}

// reflectOutcome is what one case of reflectForms saw, on either path.
type reflectOutcome struct {
	status  int
	code    string
	ae      []string // Accept-Encoding the upstream received
	leak    string   // how the sandbox recovers the secret ("" if it cannot)
	audited bool
	coding  []string // Content-Encoding beside the relayed body
	length  []string // Content-Length beside it
	bodyLen int
}

// check asserts the designed outcome of f.
func (o reflectOutcome) check(t *testing.T, f reflectForm) {
	t.Helper()
	if o.leak != "" {
		t.Errorf("the sandbox recovers the secret (%s)", o.leak)
	}
	if len(o.ae) != 1 || o.ae[0] != "identity" {
		t.Errorf("upstream Accept-Encoding %q, want identity", o.ae)
	}
	if !o.audited {
		t.Errorf("no audit record for %s", f.name)
	}
	if f.reason != "" {
		if o.status != http.StatusBadGateway || o.code != "upstream_error" {
			t.Errorf("got %d %s, want 502 upstream_error", o.status, o.code)
		}
		return
	}
	if o.status != http.StatusOK {
		t.Errorf("got %d %s, want 200", o.status, o.code)
	}
	if len(o.coding) != 0 {
		t.Errorf("Content-Encoding %q beside a decoded body", o.coding)
	}
	if len(o.length) != 1 || o.length[0] != strconv.Itoa(o.bodyLen) {
		t.Errorf("Content-Length %q beside a %d-byte body", o.length, o.bodyLen)
	}
}

// resultLen is the length of a tool result's body as the upstream's
// bytes: a JSON document as is, a string unquoted.
func resultLen(b json.RawMessage) int {
	var s string
	if json.Unmarshal(b, &s) == nil {
		return len(s)
	}
	return len(b)
}

// statusText is a status with its error code, if any, for observations.
func statusText(status int, code string) string {
	if code == "" {
		return strconv.Itoa(status)
	}
	return strconv.Itoa(status) + " " + code
}

// requestID is the request_id of a JSON error body.
func requestID(body string) string {
	_, rid := errFields(body)
	return rid
}
