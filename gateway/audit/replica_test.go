package audit

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// Every record a log with a replica id writes carries it, the writer's own
// re-creation marker included, and the chain verifies with it.
func TestReplicaInEveryRecord(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := OpenWith(path, Options{Replica: "gw-a"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	ctx := context.Background()
	if _, err := l.Append(ctx, Record{Event: "map", Fields: map[string]any{"k": "v"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, Record{Event: "sorted", Sorted: []Field{{"a", 1}, {"b", "x"}}}); err != nil {
		t.Fatal(err)
	}
	// A caller cannot claim another replica's name.
	if _, err := l.Append(ctx, Record{Event: "forged", Replica: "gw-b"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path, path+".1"); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, Record{Event: "after rotation"}); err != nil {
		t.Fatal(err)
	}
	var events []string
	for _, p := range []string{path + ".1", path} {
		ch, err := Scan(p, func(e Entry) {
			if e.Record.Replica != "gw-a" {
				t.Errorf("%s line %d (%s): replica %q, want gw-a", p, e.Line, e.Record.Event, e.Record.Replica)
			}
			events = append(events, e.Record.Event)
		})
		if err != nil || ch.Break != nil {
			t.Fatalf("%s: %v %v", p, err, ch.Break)
		}
	}
	want := []string{"map", "sorted", "forged", EventRecreated, "after rotation"}
	if len(events) != len(want) {
		t.Fatalf("events %v, want %v", events, want)
	}
	for i := range want {
		if events[i] != want[i] {
			t.Fatalf("events %v, want %v", events, want)
		}
	}
}
