package wire

import (
	"bufio"
	"bytes"
	"strings"
	"testing"
)

// TestEgressFormat: FormatEgress normalises (case, trailing dot, order,
// duplicates) and refuses what is not a name; ParseEgress accepts only the
// canonical form, so the two sides can never read one list two ways.
func TestEgressFormat(t *testing.T) {
	got, err := FormatEgress([]string{"PyPI.org.", "*.pythonhosted.org", "pypi.org"})
	if err != nil || got != "*.pythonhosted.org,pypi.org" {
		t.Fatalf("FormatEgress = %q, %v", got, err)
	}
	for _, bad := range [][]string{nil, {}, {""}, {"*"}, {"a b"}, {"a,b"}, {"1.2.3.4:80"}, {"*.*.x"}, {"x/y"}, {strings.Repeat("a.", 600) + "x"}} {
		if s, err := FormatEgress(bad); err == nil {
			t.Errorf("FormatEgress(%q) = %q, want an error", bad, s)
		}
	}
	for _, bad := range []string{"B.org", "b.org,a.org", "a.org,a.org", "a.org,", ",a.org", "a.org, b.org", "*.", strings.Repeat("a", MaxEgress+1)} {
		if _, err := ParseEgress(bad); err == nil {
			t.Errorf("ParseEgress(%q): want an error", bad)
		}
	}
	// The preamble carries it and Read refuses a non-canonical one.
	id := Identity{Sandbox: "sb", Agent: "a", Egress: got}
	line, err := Encode(id)
	if err != nil {
		t.Fatal(err)
	}
	back, err := Read(bufio.NewReader(bytes.NewReader(line)))
	if err != nil || back != id {
		t.Fatalf("Read(Encode) = %+v, %v", back, err)
	}
	bad := []byte(Prefix + `{"sandbox":"sb","agent":"a","egress":"b.org,a.org"}` + "\n")
	if _, err := Read(bufio.NewReader(bytes.NewReader(bad))); err == nil || !strings.Contains(err.Error(), "egress") {
		t.Errorf("Read of an unsorted egress: %v, want an error naming egress", err)
	}
}

// TestEgressMatch: a narrowing allows a host only as the agent allowlist's
// syntax says ("*.d" is any name below d, not d), and covers an agent
// entry only when every name it lets through the agent's list lets through.
func TestEgressMatch(t *testing.T) {
	hosts := []string{"*.pythonhosted.org", "pypi.org"}
	for host, want := range map[string]bool{
		"pypi.org": true, "files.pythonhosted.org": true, "a.b.pythonhosted.org": true,
		"pythonhosted.org": false, "evilpythonhosted.org": false, "pypi.org.evil.com": false, "www.pypi.org": false, "": false,
	} {
		if got := EgressAllows(hosts, host); got != want {
			t.Errorf("EgressAllows(%q) = %v, want %v", host, got, want)
		}
	}
	agent := []string{"pypi.org", "*.example.com"}
	for n, want := range map[string]bool{
		"pypi.org": true, "a.example.com": true, "*.example.com": true, "*.a.example.com": true,
		"example.com": false, "*.pypi.org": false, "files.pythonhosted.org": false, "*.com": false, "*.xample.com": false,
	} {
		if got := EgressCovers(agent, n); got != want {
			t.Errorf("EgressCovers(agent, %q) = %v, want %v", n, got, want)
		}
	}
}

// FuzzParseEgress: whatever ParseEgress accepts is exactly what
// FormatEgress makes of its hosts (one canonical form), and every host
// it returns matches itself.
func FuzzParseEgress(f *testing.F) {
	f.Add("pypi.org")                              // one name
	f.Add("*.pythonhosted.org,pypi.org")           // canonical pair
	f.Add("pypi.org,*.pythonhosted.org")           // unsorted: refused
	f.Add("a.org,a.org")                           // duplicate: refused
	f.Add("A.org")                                 // upper case: refused
	f.Add("*.")                                    // empty wildcard: refused
	f.Add("a..b")                                  // empty label: refused
	f.Add(strings.Repeat("a", 63) + "." + "b.org") // longest label
	f.Fuzz(func(t *testing.T, s string) {
		hosts, err := ParseEgress(s)
		if err != nil || s == "" {
			return
		}
		again, err := FormatEgress(hosts)
		if err != nil || again != s {
			t.Fatalf("ParseEgress(%q) accepted %q, FormatEgress gives %q, %v", s, hosts, again, err)
		}
		for _, h := range hosts {
			if !strings.HasPrefix(h, "*.") && !EgressAllows(hosts, h) {
				t.Fatalf("%q does not match itself in %q", h, hosts)
			}
		}
	})
}
