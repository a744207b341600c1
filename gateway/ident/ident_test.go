package ident

import (
	"strings"
	"testing"
)

// TestCanonical: spellings of one name meet in one form (THREATS E8).
func TestCanonical(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"lower case stays", "alice", "alice"},
		{"case folded", "Alice", "alice"},
		{"upper case", "ALICE", "alice"},
		{"full-width letters (NFKC)", "ａｌｉｃｅ", "alice"},
		{"full-width upper case", "ＡＬＩＣＥ", "alice"},
		{"decomposed accent composes (NFC)", "jose\u0301", "jos\u00e9"},
		{"precomposed accent", "Jos\u00c9", "jos\u00e9"},
		{"sharp s folds to ss (full folding)", "stra\u00dfe", "strasse"},
		{"ligature (NFKC)", "\ufb01ona", "fiona"},
		{"digits and punctuation", "svc-42.bot@corp", "svc-42.bot@corp"},
		{"one other script", "Алиса", "алиса"},
		{"session id", "S-1F2E", "s-1f2e"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonical(tc.in)
			if err != nil || got != tc.want {
				t.Fatalf("Canonical(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
			if again, err := Canonical(got); err != nil || again != got {
				t.Fatalf("Canonical(%q) = %q, %v; not a fixed point", got, again, err)
			}
		})
	}
}

func TestCanonicalRefuses(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "", "empty"},
		{"Cyrillic a in a Latin name (confusable)", "\u0430lice", "mixes"},
		{"Greek omicron in a Latin name", "b\u03bfb", "mixes"},
		{"zero-width joiner", "ali\u200dce", "invisible"},
		{"zero-width space", "ali\u200bce", "invisible"},
		{"right-to-left override", "\u202eecila", "invisible"},
		{"soft hyphen", "ali\u00adce", "invisible"},
		{"BOM", "\ufeffalice", "invisible"},
		{"NUL", "ali\x00ce", "control"},
		{"newline", "alice\n", "control"},
		{"C1 control", "ali\u0085ce", "control"},
		{"space", "alice smith", "whitespace"},
		{"no-break space", "alice\u00a0", "whitespace"},
		{"invalid UTF-8", "ali\xffce", "UTF-8"},
		{"too long", strings.Repeat("a", MaxLen+1), "longer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Canonical(tc.in)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Canonical(%q) = %q, %v; want an error naming %q", tc.in, got, err, tc.want)
			}
		})
	}
}

func TestSameAndConflict(t *testing.T) {
	for _, tc := range []struct {
		a, b           string
		same, conflict bool
	}{
		{"alice", "Alice", true, true},
		{"alice", "ＡＬＩＣＥ", true, true},
		{"alice", "bob", false, false},
		{"alice", "\u0430lice", false, true}, // the confusable spelling is refused: a conflict, never a stranger
		{"", "alice", false, false},
		{"", "", false, false},
	} {
		if got := Same(tc.a, tc.b); got != tc.same {
			t.Errorf("Same(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.same)
		}
		if got := Conflict(tc.a, tc.b); got != tc.conflict {
			t.Errorf("Conflict(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.conflict)
		}
	}
}

func FuzzCanonical(f *testing.F) {
	for _, s := range []string{"alice", "Alice", "ａｌｉｃｅ", "jose\u0301", "\u0430lice", "ali\u200dce"} { // case, width, NFC, confusable, invisible
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		c, err := Canonical(in)
		if err != nil {
			return
		}
		if again, err := Canonical(c); err != nil || again != c {
			t.Fatalf("%q -> %q -> %q %v", in, c, again, err)
		}
	})
}

// TestPersonRefusesMarkers: the approver markers' forms are not people's
// names, however spelled (case, NFKC compatibility forms); names that
// merely contain them are.
func TestPersonRefusesMarkers(t *testing.T) {
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"alice", true},
		{"alice:connection:docs", true},
		{"connection", true},
		{"connection:docs", false},
		{"Connection:Docs", false},
		{"ＣＯＮＮＥＣＴＩＯＮ：docs", false}, // full-width letters and colon
		{"group:finance", false},
		{"GROUP:finance", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Person(tc.name)
			if (err == nil) != tc.ok {
				t.Fatalf("Person(%q) = %v, want ok %v", tc.name, err, tc.ok)
			}
			if err != nil && !strings.Contains(err.Error(), "approver marker") {
				t.Fatalf("error does not say why: %v", err)
			}
		})
	}
}
