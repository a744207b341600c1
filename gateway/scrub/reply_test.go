package scrub

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
)

func gz(b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

func zl(b []byte) []byte {
	var buf bytes.Buffer
	w := zlib.NewWriter(&buf)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

func rawDeflate(b []byte) []byte {
	var buf bytes.Buffer
	w, _ := flate.NewWriter(&buf, flate.BestSpeed)
	_, _ = w.Write(b)
	_ = w.Close()
	return buf.Bytes()
}

// TestReply is THREATS D11 for whole replies: every Content-Encoding line
// and member counts (RFC 9110 8.4), gzip and deflate are undone and
// scrubbed, anything else encoded or compressed is refused, and the
// length sent is the scrubbed body's.
func TestReply(t *testing.T) {
	const key = "sk_live_0123456789abcdef"
	plain := []byte(`{"echo":"` + key + `"}`)
	want := `{"echo":"` + Replacement + `"}`
	const limit = 1 << 20
	tests := []struct {
		name   string
		hdr    http.Header
		body   []byte
		reason string // "" = relayed, scrubbed
	}{
		{"no coding", http.Header{}, plain, ""},
		{"identity", http.Header{"Content-Encoding": {"identity"}}, plain, ""},
		{"empty coding member", http.Header{"Content-Encoding": {" , identity,"}}, plain, ""},
		{"two lines: identity then gzip", http.Header{"Content-Encoding": {"identity", "gzip"}}, gz(plain), ""},
		{"two lines: gzip then identity", http.Header{"Content-Encoding": {"gzip", "identity"}}, gz(plain), ""},
		{"one line: gzip, identity", http.Header{"Content-Encoding": {"gzip, identity"}}, gz(plain), ""},
		{"one line: identity, GZIP (case)", http.Header{"Content-Encoding": {"identity, GZIP"}}, gz(plain), ""},
		{"x-gzip", http.Header{"Content-Encoding": {"x-gzip"}}, gz(plain), ""},
		{"gzip twice", http.Header{"Content-Encoding": {"gzip", "gzip"}}, gz(gz(plain)), ""},
		{"deflate (zlib, RFC 9110 8.4.1.2)", http.Header{"Content-Encoding": {"deflate"}}, zl(plain), ""},
		{"deflate sent raw", http.Header{"Content-Encoding": {"deflate"}}, rawDeflate(plain), ""},
		{"deflate then gzip on two lines", http.Header{"Content-Encoding": {"deflate", "gzip"}}, gz(zl(plain)), ""},
		{"three codings", http.Header{"Content-Encoding": {"gzip, gzip, gzip"}}, gz(gz(gz(plain))), "encoded_reply"},
		{"br", http.Header{"Content-Encoding": {"identity", "br"}}, plain, "encoded_reply"},
		{"zstd", http.Header{"Content-Encoding": {"zstd"}}, plain, "encoded_reply"},
		{"compress", http.Header{"Content-Encoding": {"compress"}}, plain, "encoded_reply"},
		{"unknown coding", http.Header{"Content-Encoding": {"rot13"}}, plain, "encoded_reply"},
		{"claims gzip, is not", http.Header{"Content-Encoding": {"gzip"}}, plain, "encoded_reply"},
		{"truncated gzip", http.Header{"Content-Encoding": {"gzip"}}, gz(plain)[:20], "encoded_reply"},
		{"gzip body without Content-Encoding", http.Header{"Content-Type": {"application/json"}}, gz(plain), "opaque_reply"},
		{"gzip body under identity", http.Header{"Content-Encoding": {"identity"}}, gz(plain), "opaque_reply"},
		{"gzip inside gzip, one coding declared", http.Header{"Content-Encoding": {"gzip"}}, gz(gz(plain)), "opaque_reply"},
		{"zlib body without coding", http.Header{}, zl(plain), "opaque_reply"},
		{"zstd magic", http.Header{}, append([]byte{0x28, 0xb5, 0x2f, 0xfd}, plain...), "opaque_reply"},
		{"bzip2 magic", http.Header{}, append([]byte("BZh91AY&SY"), plain...), "opaque_reply"},
		{"xz magic", http.Header{}, append([]byte{0xfd, '7', 'z', 'X', 'Z', 0}, plain...), "opaque_reply"},
		{"zip magic", http.Header{}, append([]byte("PK\x03\x04"), plain...), "opaque_reply"},
		{"application/gzip with a plain body", http.Header{"Content-Type": {"application/gzip"}}, []byte("x"), "opaque_reply"},
		{"application/zip", http.Header{"Content-Type": {"Application/ZIP; x=1"}}, []byte("x"), "opaque_reply"},
		{"+zip suffix", http.Header{"Content-Type": {"application/vnd.example+zip"}}, []byte("x"), "opaque_reply"},
		{"Content-Range", http.Header{"Content-Range": {"bytes 0-9/40"}}, plain[:10], "partial_reply"},
		{"multipart/byteranges", http.Header{"Content-Type": {"multipart/byteranges; boundary=x"}}, []byte("--x"), "partial_reply"},
		{"gzip bomb past the limit", http.Header{"Content-Encoding": {"gzip"}}, gz(make([]byte, limit+1)), "reply_too_large"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New([]byte(key))
			h := tt.hdr.Clone()
			h.Set("Content-Length", strconv.Itoa(len(tt.body)))
			h.Set("Content-Md5", "upstream-digest")
			out, found, err := s.Reply(h, tt.body, limit)
			if tt.reason != "" {
				var re *ReplyError
				if !errors.As(err, &re) || re.Reason != tt.reason {
					t.Fatalf("err = %v, want reason %s", err, tt.reason)
				}
				if strings.Contains(err.Error(), "rot13") {
					t.Errorf("the error repeats a coding name the upstream chose: %q", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Reply: %v", err)
			}
			if string(out) != want || !found {
				t.Errorf("body %q found %v, want %q", out, found, want)
			}
			if len(h.Values("Content-Encoding")) != 0 {
				t.Errorf("Content-Encoding left: %q", h.Values("Content-Encoding"))
			}
			if got := h.Values("Content-Length"); len(got) != 1 || got[0] != strconv.Itoa(len(out)) {
				t.Errorf("Content-Length %q for a %d-byte body", got, len(out))
			}
			if h.Get("Content-Md5") != "" {
				t.Error("a digest of the upstream's body was kept")
			}
		})
	}
}

// TestReplyClean: a reply without the secret passes unchanged, its
// Content-Length the body's own.
func TestReplyClean(t *testing.T) {
	s := New([]byte("sk_live_0123456789abcdef"))
	h := http.Header{"Content-Type": {"image/png"}, "Content-Length": {"999"}}
	body := []byte("\x89PNG\r\n\x1a\n....")
	out, found, err := s.Reply(h, body, 1<<20)
	if err != nil || found || !bytes.Equal(out, body) || h.Get("Content-Length") != strconv.Itoa(len(body)) {
		t.Fatalf("Reply: %q %v %v, Content-Length %s", out, found, err, h.Get("Content-Length"))
	}
}

// TestReplySecretInHeaderAndCoding: the secret in a header value, a
// header name and the coding name itself never reaches the error text.
func TestReplySecretInHeaderAndCoding(t *testing.T) {
	const key = "sk_live_0123456789abcdef"
	s := New([]byte(key))
	h := http.Header{"X-Echo": {"k=" + key}, "X-" + key: {"1"}}
	if _, found, err := s.Reply(h, []byte("ok"), 1<<20); err != nil || !found || h.Get("X-Echo") != "k="+Replacement || len(h) != 2 {
		t.Fatalf("found %v err %v header %v", found, err, h)
	}
	_, _, err := s.Reply(http.Header{"Content-Encoding": {key}}, []byte("ok"), 1<<20)
	if err == nil || strings.Contains(strings.ToLower(err.Error()), key) {
		t.Fatalf("err %v", err)
	}
}

// FuzzReply checks that Reply never panics, refuses only with a
// *ReplyError, and never lets the raw secret through in a header or the
// body it relays, whatever codings and bytes the upstream sends.
func FuzzReply(f *testing.F) {
	f.Add("sk_live_0123456789", "identity", "gzip", gz([]byte(`{"k":"sk_live_0123456789"}`))) // two lines
	f.Add("sk_live_0123456789", "gzip, identity", "", gz([]byte(`sk_live_0123456789`)))       // one line, two members
	f.Add("sk_live_0123456789", "", "", gz([]byte(`x`)))                                      // gzip without a coding
	f.Add("sk_live_0123456789", "deflate", "", zl([]byte(`%73k_live_0123456789`)))            // zlib, percent-escaped
	f.Add("sk_live_0123456789", "", "", []byte(`{"\u0073k_live_0123456789":1}`))              // \u-escaped key
	f.Add("sk_live_0123456789", "br", "gzip", []byte(`sk_live_0123456789`))                   // unsupported coding
	f.Add("päss-wörd-secret", "", "", []byte(`"p\u00e4ss-w&#246;rd-secret"`))                 // mixed escapes
	f.Fuzz(func(t *testing.T, secret, ce1, ce2 string, body []byte) {
		s := New([]byte(secret))
		h := http.Header{"X-Echo": {secret}}
		for _, ce := range []string{ce1, ce2} {
			if ce != "" {
				h.Add("Content-Encoding", ce)
			}
		}
		out, _, err := s.Reply(h, body, 1<<16)
		if err != nil {
			var re *ReplyError
			if !errors.As(err, &re) || re.Reason == "" {
				t.Fatalf("error %T %v is not a *ReplyError with a reason", err, err)
			}
			return
		}
		if len(secret) < MinLen || strings.ContainsAny(secret, Replacement) {
			return // the replacement text itself could rebuild such a secret
		}
		low := strings.ToLower(secret)
		if strings.Contains(strings.ToLower(string(out)), low) {
			t.Fatalf("secret %q survives in the body %q", secret, out)
		}
		for k, vs := range h {
			if strings.Contains(strings.ToLower(k+": "+strings.Join(vs, ",")), low) {
				t.Fatalf("secret %q survives in header %s: %q", secret, k, vs)
			}
		}
		if h.Get("Content-Length") != strconv.Itoa(len(out)) {
			t.Fatalf("Content-Length %q for %d bytes", h.Get("Content-Length"), len(out))
		}
	})
}
