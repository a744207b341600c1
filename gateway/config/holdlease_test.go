package config

import (
	"strings"
	"testing"
	"time"
)

// TestHoldLease: gateway.hold_lease is unset by default (the holds
// package's 15s), takes a duration of at least 1s, and a shorter or
// negative one is refused naming the key.
func TestHoldLease(t *testing.T) {
	c, err := Parse([]byte(good), "/etc/sluice")
	if err != nil || c.Gateway.HoldLease != 0 {
		t.Fatalf("default hold_lease %v, %v; want unset", c.Gateway.HoldLease.Std(), err)
	}
	set := func(v string) string {
		return strings.Replace(good, "  hold_wait: 5s\n", "  hold_wait: 5s\n  hold_lease: "+v+"\n", 1)
	}
	if c, err = Parse([]byte(set("4s")), "/etc/sluice"); err != nil || c.Gateway.HoldLease.Std() != 4*time.Second {
		t.Errorf("hold_lease 4s: %v, %v", c.Gateway.HoldLease.Std(), err)
	}
	for _, bad := range []string{"500ms", "-2s"} {
		if _, err := Parse([]byte(set(bad)), "/etc/sluice"); err == nil || !strings.Contains(err.Error(), "gateway.hold_lease: ") {
			t.Errorf("hold_lease %s: err %v, want one naming gateway.hold_lease", bad, err)
		}
	}
}
