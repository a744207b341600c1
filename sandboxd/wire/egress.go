package wire

import (
	"fmt"
	"slices"
	"strings"
)

// FormatEgress returns the canonical Identity.Egress for hosts: each entry
// lower-cased and without a trailing dot, checked (an exact DNS name, or
// "*." and one: any name below it, not the name itself), then sorted and
// deduplicated, joined by commas. An empty list is refused: "no
// narrowing" is the empty string, not an empty list, so that a caller
// who meant to narrow can never end up unnarrowed by mistake.
func FormatEgress(hosts []string) (string, error) {
	if len(hosts) == 0 {
		return "", fmt.Errorf("wire: egress: no host given")
	}
	out := make([]string, 0, len(hosts))
	for _, h := range hosts {
		n := strings.TrimSuffix(strings.ToLower(h), ".")
		if !ValidEgressHost(n) {
			return "", fmt.Errorf("wire: egress: %q is not a DNS name or *.name", truncate(h))
		}
		out = append(out, n)
	}
	slices.Sort(out)
	out = slices.Compact(out)
	s := strings.Join(out, ",")
	if len(s) > MaxEgress {
		return "", fmt.Errorf("wire: egress: the list is %d bytes, longer than %d", len(s), MaxEgress)
	}
	return s, nil
}

// ParseEgress splits an Identity.Egress into its hosts, strictly: s must be
// exactly what FormatEgress makes ("" gives nil, no narrowing). A list in
// any other form (upper case, unsorted, duplicated, empty entries) is
// refused rather than normalised, so the gateway and sandboxd can never
// read one narrowing two ways.
func ParseEgress(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	if len(s) > MaxEgress {
		return nil, fmt.Errorf("wire: identity field egress longer than %d bytes", MaxEgress)
	}
	hosts := strings.Split(s, ",")
	for i, h := range hosts {
		if !ValidEgressHost(h) {
			return nil, fmt.Errorf("wire: identity field egress: entry %d (%q) is not a lower-case DNS name or *.name", i, truncate(h))
		}
		if i > 0 && hosts[i-1] >= h {
			return nil, fmt.Errorf("wire: identity field egress: entries not sorted and unique at %d", i)
		}
	}
	return hosts, nil
}

// EgressAllows reports whether host is on the narrowing hosts (as
// ParseEgress returns it): equal to an exact entry, or strictly below a
// "*.name" entry. host is compared as given: the caller passes the
// canonical name it decides on.
func EgressAllows(hosts []string, host string) bool {
	for _, h := range hosts {
		if d, ok := strings.CutPrefix(h, "*."); ok {
			if strings.HasSuffix(host, "."+d) {
				return true
			}
		} else if host == h {
			return true
		}
	}
	return false
}

// EgressCovers reports whether the allowlist list (agents[].egress
// entries, same syntax) lets through every name that entry n lets
// through: an exact name that list allows, or "*.d" when list has "*.d"
// or "*.e" with d below e.
func EgressCovers(list []string, n string) bool {
	d, wild := strings.CutPrefix(n, "*.")
	if !wild {
		return EgressAllows(list, n)
	}
	for _, a := range list {
		if e, ok := strings.CutPrefix(a, "*."); ok && (d == e || strings.HasSuffix(d, "."+e)) {
			return true
		}
	}
	return false
}

// ValidEgressHost reports whether h is a lower-case DNS name of labels of
// 1-63 letters, digits, '-' or '_', at most 253 bytes, optionally after
// "*.": an agents[].egress entry, and an entry of a sandbox's narrowing.
func ValidEgressHost(h string) bool {
	h = strings.TrimPrefix(h, "*.")
	if h == "" || len(h) > 253 {
		return false
	}
	for _, l := range strings.Split(h, ".") {
		if l == "" || len(l) > 63 {
			return false
		}
		for i := 0; i < len(l); i++ {
			switch b := l[i]; {
			case 'a' <= b && b <= 'z', '0' <= b && b <= '9', b == '-', b == '_':
			default:
				return false
			}
		}
	}
	return true
}
