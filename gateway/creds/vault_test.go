package creds

import (
	"testing"

	"github.com/sluice-gw/sluice/policy"
)

// TestExpandPath: {user} takes only a name that stays one path segment;
// anything else, or no user at all, is refused before Vault is asked.
func TestExpandPath(t *testing.T) {
	ref := func(user string) Ref {
		return Ref{Connector: "billing", Caller: policy.Caller{User: user}}
	}
	for _, tc := range []struct {
		name, path, user, want string
		ok                     bool
	}{
		{"user and connector", "secret/data/{connector}/{user}", "alice", "secret/data/billing/alice", true},
		{"no placeholder needs no user", "secret/data/shared", "", "secret/data/shared", true},
		{"no user", "secret/data/{user}", "", "", false},
		{"traversal", "secret/data/{user}", "../sys", "", false},
		{"dot dot", "secret/data/{user}", "..", "", false},
		{"query in a name", "secret/data/{user}", "a?list=true", "", false},
		{"slash", "secret/data/{user}", "a/b", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := expandPath(tc.path, ref(tc.user))
			if (err == nil) != tc.ok || got != tc.want {
				t.Fatalf("expandPath(%q, %q) = %q, %v; want %q ok=%v", tc.path, tc.user, got, err, tc.want, tc.ok)
			}
		})
	}
}
