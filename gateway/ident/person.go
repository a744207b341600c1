package ident

import (
	"fmt"
	"strings"
)

// Markers are the prefixes of approver names that are not people: a
// decision's "group:G", and "connection:SLUG", which the gateway itself
// approves as when the person connects SLUG (a call held until then).
var Markers = []string{"group:", "connection:"}

// Person is Canonical for the name of a person (a sandbox's user, a
// review UI or OIDC sign-in), refusing also a name of a marker's form: a
// person named "connection:docs" would otherwise match the approver the
// gateway uses for calls held until someone connects docs, and approve
// them. The check is on the canonical form, so "Connection:docs" and a
// full-width colon are refused alike.
func Person(name string) (string, error) {
	c, err := Canonical(name)
	if err != nil {
		return "", err
	}
	for _, m := range Markers {
		if strings.HasPrefix(c, m) {
			return "", fmt.Errorf("ident: a person's name may not begin with %q (an approver marker)", m)
		}
	}
	return c, nil
}
