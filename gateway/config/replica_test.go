package config

import (
	"strings"
	"testing"
)

func TestReplicaID(t *testing.T) {
	t.Setenv("POD_NAME", "sluice-7d9f-x2")
	t.Setenv("HOSTNAME", "node-1")
	c, err := Parse([]byte(good), "/etc/sluice")
	if err != nil {
		t.Fatal(err)
	}
	if c.Gateway.ReplicaID != "sluice-7d9f-x2" {
		t.Errorf("default replica_id = %q, want POD_NAME's", c.Gateway.ReplicaID)
	}
	t.Setenv("POD_NAME", "")
	if c, err = Parse([]byte(good), "/etc/sluice"); err != nil || c.Gateway.ReplicaID != "node-1" {
		t.Errorf("without POD_NAME: replica_id %q, %v; want HOSTNAME's", c.Gateway.ReplicaID, err)
	}
	set := strings.Replace(good, "  hold_wait: 5s\n", "  hold_wait: 5s\n  replica_id: gw-b\n", 1)
	if c, err = Parse([]byte(set), "/etc/sluice"); err != nil || c.Gateway.ReplicaID != "gw-b" {
		t.Errorf("set: replica_id %q, %v", c.Gateway.ReplicaID, err)
	}
	for _, bad := range []string{"a/b", "-x", "x y", "a:b", strings.Repeat("a", 64), "é"} {
		set := strings.Replace(good, "  hold_wait: 5s\n", "  hold_wait: 5s\n  replica_id: '"+bad+"'\n", 1)
		_, err := Parse([]byte(set), "/etc/sluice")
		if err == nil || !strings.Contains(err.Error(), "gateway.replica_id: ") {
			t.Errorf("replica_id %q: err %v, want one naming gateway.replica_id", bad, err)
		}
	}
	t.Setenv("HOSTNAME", "bad host")
	if _, err := Parse([]byte(good), "/etc/sluice"); err == nil || !strings.Contains(err.Error(), "gateway.replica_id: \"bad host\"") {
		t.Errorf("an unsafe default: err %v, want one naming gateway.replica_id", err)
	}
}
