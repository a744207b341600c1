package egress

import (
	"net/url"
	"strings"
	"testing"
)

// TestNormalizePath: the one form raw-egress policy decides on and the
// upstream receives (THREATS C11).
func TestNormalizePath(t *testing.T) {
	for _, tc := range []struct {
		name, in, sent, decoded string
	}{
		{"plain", "/admin", "/admin", "/admin"},
		{"empty is the root", "", "/", "/"},
		{"double slash merged", "//admin", "/admin", "/admin"},
		{"many slashes merged", "/a///b//", "/a/b/", "/a/b/"},
		{"dot segment (RFC 3986 5.2.4)", "/./admin", "/admin", "/admin"},
		{"dot-dot segment (RFC 3986 5.2.4)", "/x/../admin", "/admin", "/admin"},
		{"dot-dot above the root stays at the root (RFC 3986 5.4.2)", "/../../admin", "/admin", "/admin"},
		{"encoded dot is a dot segment (RFC 3986 6.2.2.2)", "/%2e/admin", "/admin", "/admin"},
		{"mixed-case encoded dot-dot", "/x/%2E%2e/admin", "/admin", "/admin"},
		{"half-encoded dot-dot", "/x/.%2e/admin", "/admin", "/admin"},
		{"encoded unreserved letters decoded", "/%61dm%69n", "/admin", "/admin"},
		{"trailing dot keeps the slash", "/admin/.", "/admin/", "/admin/"},
		{"trailing dot-dot", "/admin/x/..", "/admin/", "/admin/"},
		{"reserved escapes kept, upper-cased (RFC 3986 6.2.2.1)", "/a%3fb%3a", "/a%3Fb%3A", "/a?b:"},
		{"space encoded", "/a%20b", "/a%20b", "/a b"},
		{"raw non-pchar bytes encoded", "/a{b}", "/a%7Bb%7D", "/a{b}"},
		{"sub-delims kept", "/a;b=c,d", "/a;b=c,d", "/a;b=c,d"},
		{"dots inside a name are not segments", "/a..b/.c", "/a..b/.c", "/a..b/.c"},
		{"percent itself stays encoded", "/%2561dmin", "/%2561dmin", "/%61dmin"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := normalizePath(tc.in)
			if err != nil {
				t.Fatalf("normalizePath(%q): %v", tc.in, err)
			}
			if p.sent != tc.sent || p.decoded != tc.decoded {
				t.Fatalf("normalizePath(%q) = sent %q decoded %q, want %q %q", tc.in, p.sent, p.decoded, tc.sent, tc.decoded)
			}
			// Idempotent: the sent form normalises to itself.
			if q, err := normalizePath(p.sent); err != nil || q != p {
				t.Fatalf("normalizePath(%q) = %+v, %v; not a fixed point", p.sent, q, err)
			}
			u := &url.URL{Scheme: "http", Host: "h"}
			if err := p.setOn(u); err != nil || u.RequestURI() != tc.sent {
				t.Fatalf("sent as %q (%v), want %q", u.RequestURI(), err, tc.sent)
			}
		})
	}
}

func TestNormalizePathRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"encoded slash", "/admin%2f..", "encoded slash"},
		{"encoded slash upper case", "/x%2F../admin", "encoded slash"},
		{"encoded backslash", "/x%5c..%5cadmin", "encoded backslash"},
		{"literal backslash", "/x\\..\\admin", "backslash"},
		{"dot-dot with parameters (Tomcat)", "/x/..;/admin", "dot segment with parameters"},
		{"encoded dot-dot with parameters", "/x/%2e%2e;a=b/admin", "dot segment with parameters"},
		{"dot with parameters", "/.;/admin", "dot segment with parameters"},
		{"encoded NUL", "/admin%00.json", "control character"},
		{"encoded CR", "/a%0db", "control character"},
		{"raw control byte", "/a\x01b", "control character"},
		{"short escape", "/a%2", "malformed percent-encoding"},
		{"bad hex", "/a%zz", "malformed percent-encoding"},
		{"not absolute", "admin", "does not start with /"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := normalizePath(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("normalizePath(%q) = %+v, %v; want an error naming %q", tc.in, p, err, tc.want)
			}
		})
	}
}

// FuzzNormalizePath: whatever is accepted is a fixed point, starts with
// "/", has no dot segment or empty segment but a trailing one, and is
// sent exactly.
func FuzzNormalizePath(f *testing.F) {
	for _, s := range []string{"/", "//a", "/./a", "/a/../b", "/%2e%2E/x", "/a%2fb", "/..;/a", "/%41"} { // dot segments, encoded dots and slashes
		f.Add(s)
	}
	for _, s := range []string{"/a/b;c/", "/;/.;/", "/a/.", "/a/..;", "/x@y:z!$&'()*+,=~", "/a//", "/a b", ".", ""} { // the fast path's edges
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		p, err := normalizePath(in)
		if plainPath(in) {
			// The fast path returns what the general one does.
			if q, serr := normalizePathSlow(in); serr != nil || err != nil || q != p {
				t.Fatalf("%q: fast path gives %+v %v, the general one %+v %v", in, p, err, q, serr)
			}
		}
		if err != nil {
			return
		}
		if q, err := normalizePath(p.sent); err != nil || q != p {
			t.Fatalf("%q -> %q -> %+v %v", in, p.sent, q, err)
		}
		segs := strings.Split(p.sent[1:], "/")
		for i, s := range segs {
			if s == "." || s == ".." || s == "" && i != len(segs)-1 {
				t.Fatalf("%q -> %q keeps segment %q", in, p.sent, s)
			}
		}
		u := &url.URL{}
		if err := p.setOn(u); err != nil {
			t.Fatal(err)
		}
	})
}

// TestPlainPath: the usual request path takes the fast path; anything
// normalizePath would change, decode or refuse does not.
func TestPlainPath(t *testing.T) {
	for in, want := range map[string]bool{
		"/": true, "/plain": true, "/a/b/": true, "/simple/v1.2/x;y=1": true, "/a/.b/..c": true,
		"": false, "a": false, "//": false, "/a//b": false, "/./a": false, "/a/..": false, "/..;x/a": false,
		"/a%41": false, "/a b": false, "/a\\b": false, "/é": false, "/a?b": false,
	} {
		if got := plainPath(in); got != want {
			t.Errorf("plainPath(%q) = %v, want %v", in, got, want)
		}
	}
}
