package catalog

import (
	"strings"
	"testing"
)

// TestUpstreamScrubber checks the per-upstream scrubber cache: the same
// credential reuses its scrubber, a changed one (rotated, or a basic-auth
// password added) gets a new scrubber that finds the new secret.
func TestUpstreamScrubber(t *testing.T) {
	const first, rotated = "sk-first-0123456789", "sk-rotated-9876543210"
	cases := []struct {
		name      string
		prev, now [][]byte
		reuse     bool
		find      string // a secret the scrubber in use must find
	}{
		{"same credential", [][]byte{[]byte(first)}, [][]byte{[]byte(first)}, true, first},
		{"rotated", [][]byte{[]byte(first)}, [][]byte{[]byte(rotated)}, false, rotated},
		{"same length, one byte differs", [][]byte{[]byte(first)}, [][]byte{[]byte(first[:len(first)-1] + "X")}, false, first[:len(first)-1] + "X"},
		{"password form added", [][]byte{[]byte("user:pass-0123456")}, [][]byte{[]byte("user:pass-0123456"), []byte("pass-0123456")}, false, "pass-0123456"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := &Upstream{}
			a := u.Scrubber(tc.prev)
			b := u.Scrubber(tc.now)
			if (a == b) != tc.reuse {
				t.Fatalf("scrubber reused = %v, want %v", a == b, tc.reuse)
			}
			out, found := b.String("reply " + tc.find + " end")
			if !found || strings.Contains(out, tc.find) {
				t.Fatalf("scrubber in use did not scrub %q: %q", tc.find, out)
			}
		})
	}
	t.Run("cached forms are copies", func(t *testing.T) {
		u := &Upstream{}
		sec := []byte(first)
		a := u.Scrubber([][]byte{sec})
		copy(sec, rotated) // the caller's buffer is reused for another secret
		if b := u.Scrubber([][]byte{[]byte(first)}); a != b {
			t.Fatal("the cache followed a change to the caller's buffer")
		}
	})
}
