package review

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of what a page shows of one agent-controlled value. Agent text is
// hostile: a megabyte string must not make a page unusable, and what is cut
// stays reachable behind an expand control (a <details>, no script).
const (
	previewBytes  = 4 << 10   // shown at once
	expandedBytes = 256 << 10 // shown after expanding; the rest is counted
)

// invisible reports whether r is a control, zero-width or bidi character
// that would hide or reorder text on the page: C0/C1 controls (but tab and
// newline, which pre-formatted blocks need), U+200B–U+200F, U+202A–U+202E,
// U+2066–U+2069, U+2028/U+2029 and U+FEFF.
func invisible(r rune) bool {
	switch {
	case r == '\t' || r == '\n':
		return false
	case r < 0x20 || (r >= 0x7f && r <= 0x9f):
		return true
	case r >= 0x200b && r <= 0x200f, r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069,
		r == 0x2028, r == 0x2029, r == 0xfeff, r == 0x061c, r == 0x180e:
		return true
	}
	return false
}

// visible escapes s for HTML and replaces every invisible character (and
// every invalid UTF-8 byte) with a styled marker such as ⟦U+202E⟧, so an
// approver sees exactly which characters are there.
func visible(s string) template.HTML {
	var b strings.Builder
	b.Grow(len(s) + 16)
	start := 0
	flush := func(end int) {
		if end > start {
			template.HTMLEscape(&b, []byte(s[start:end]))
		}
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			flush(i)
			fmt.Fprintf(&b, `<span class="cc" title="invalid UTF-8 byte">⟦0x%02X⟧</span>`, s[i])
			start = i + n
		case invisible(r):
			flush(i)
			fmt.Fprintf(&b, `<span class="cc" title="invisible or bidi control character">⟦U+%04X⟧</span>`, r)
			start = i + n
		}
		i += n
	}
	flush(len(s))
	return template.HTML(b.String())
}

// cut splits s at most n bytes in, on a rune boundary.
func cut(s string, n int) (head, rest string) {
	if len(s) <= n {
		return s, ""
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n], s[n:]
}

// Long is one possibly huge value as a page shows it.
type Long struct {
	Head    template.HTML // the first previewBytes, made visible
	More    template.HTML // up to expandedBytes more, behind <details>
	MoreLen int           // bytes in More
	Omitted int           // bytes not shown at all
}

// long prepares s for a page: a preview, an expandable remainder and a count
// of what is left out.
func long(s string) Long {
	head, rest := cut(s, previewBytes)
	more, omitted := cut(rest, expandedBytes)
	return Long{Head: visible(head), More: visible(more), MoreLen: len(more), Omitted: len(omitted)}
}

// Seg is a piece of a pretty-printed document: plain text or a long value.
type Seg struct {
	Text template.HTML
	Long *Long
}

// prettyJSON renders a JSON document indented, every string value shown
// visibly and long strings cut with an expand control. A document that is
// not JSON is shown as text.
func prettyJSON(doc []byte) []Seg {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil || dec.More() {
		l := long(string(doc))
		return []Seg{{Long: &l}}
	}
	p := &printer{}
	p.value(v, 0)
	p.flush()
	return p.segs
}

type printer struct {
	segs []Seg
	buf  strings.Builder
}

func (p *printer) text(s string) { p.buf.WriteString(s) }

func (p *printer) flush() {
	if p.buf.Len() > 0 {
		p.segs = append(p.segs, Seg{Text: visible(p.buf.String())})
		p.buf.Reset()
	}
}

func (p *printer) str(s string) {
	if len(s) <= previewBytes {
		p.text(quote(s))
		return
	}
	p.flush()
	l := long(s)
	p.segs = append(p.segs, Seg{Text: `"`}, Seg{Long: &l}, Seg{Text: `"`})
}

func (p *printer) value(v any, depth int) {
	ind := strings.Repeat("  ", depth+1)
	switch x := v.(type) {
	case map[string]any:
		if len(x) == 0 {
			p.text("{}")
			return
		}
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		p.text("{\n")
		for i, k := range keys {
			p.text(ind)
			p.str(k)
			p.text(": ")
			p.value(x[k], depth+1)
			if i < len(keys)-1 {
				p.text(",")
			}
			p.text("\n")
		}
		p.text(ind[2:] + "}")
	case []any:
		if len(x) == 0 {
			p.text("[]")
			return
		}
		p.text("[\n")
		for i, e := range x {
			p.text(ind)
			p.value(e, depth+1)
			if i < len(x)-1 {
				p.text(",")
			}
			p.text("\n")
		}
		p.text(ind[2:] + "]")
	case string:
		p.str(x)
	case json.Number:
		p.text(x.String())
	case bool:
		p.text(strconv.FormatBool(x))
	case nil:
		p.text("null")
	default:
		p.text(fmt.Sprint(x))
	}
}

// quote writes s as a JSON-like string literal but leaves control, bidi and
// zero-width characters in place, for visible to mark them the same way
// everywhere (⟦U+202E⟧ rather than \u202e here and a marker elsewhere).
func quote(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`, "\t", `\t`)
	return `"` + r.Replace(s) + `"`
}
