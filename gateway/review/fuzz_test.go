package review

import (
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"
)

// FuzzRender checks that whatever an agent puts in a hold, the rendered
// HTML carries no markup of its own and no invisible or bidi character.
func FuzzRender(f *testing.F) {
	f.Add([]byte(`{"a":"<script>alert(1)</script>"}`))         // markup in a string value
	f.Add([]byte("{\"k\u202e\":\"x\u2066y\u200bz\ufeff\"}"))   // bidi and zero-width in key and value
	f.Add([]byte("not json <img src=x onerror=alert(1)>\x00")) // not JSON at all, with NUL
	f.Add([]byte(`["\u0085", 1e999, null, true, {"":[]}]`))    // C1 control, huge number, nesting
	f.Add([]byte("\xff\xfe<\"'&>"))                            // invalid UTF-8 and every HTML special
	f.Fuzz(func(t *testing.T, doc []byte) {
		var b strings.Builder
		for _, s := range prettyJSON(doc) {
			if s.Long != nil {
				b.WriteString(string(s.Long.Head))
				b.WriteString(string(s.Long.More))
			} else {
				b.WriteString(string(s.Text))
			}
		}
		out := b.String()
		// Our own markup is only <span class="cc" ...>…</span>; drop it and
		// no '<' may remain.
		stripped := spanRE.ReplaceAllString(out, "")
		if strings.ContainsAny(stripped, "<>") {
			t.Fatalf("markup survived: %q", stripped)
		}
		for _, r := range out {
			if invisible(r) {
				t.Fatalf("invisible %U survived in %q", r, out)
			}
		}
		if !utf8.ValidString(out) {
			t.Fatalf("invalid UTF-8 in output")
		}
	})
}

var spanRE = regexp.MustCompile(`<span class="cc" title="[a-zA-Z0-9 -]+">⟦[^⟧<>]*⟧</span>`)
