package vault

import (
	"strings"
	"testing"
)

// TestValidNameMatchesRE holds the hand-written name check equal to the
// documented pattern, nameRE, on the edges of each of its rules.
func TestValidNameMatchesRE(t *testing.T) {
	cases := []string{
		"", "a", "Z", "0", "_", ".", "-", "a_", "a.", "a-", "a-b.c_d", "-a", ".a", "_a",
		"a b", "a/b", "a:b", "é", "aé", "a\x00", "a\n", "API_KEY", "stripe.live-key",
		strings.Repeat("a", 127), strings.Repeat("a", 128), strings.Repeat("a", 129),
		"a" + strings.Repeat("-", 127), "a" + strings.Repeat("-", 128),
	}
	for c := 0; c < 256; c++ {
		cases = append(cases, string(rune(c)), "a"+string([]byte{byte(c)}), string([]byte{byte(c)})+"a")
	}
	for _, s := range cases {
		if got, want := validName(s), nameRE.MatchString(s); got != want {
			t.Errorf("validName(%q) = %v, nameRE says %v", s, got, want)
		}
	}
}

func FuzzValidName(f *testing.F) {
	f.Add("stripe.live-key") // a valid name
	f.Add("-leading")        // a leading punctuation mark
	f.Add("a/b")             // a slash
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := validName(s), nameRE.MatchString(s); got != want {
			t.Fatalf("validName(%q) = %v, nameRE says %v", s, got, want)
		}
	})
}
