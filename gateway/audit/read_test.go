package audit

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestScan: every line comes out, in order, saying whether the chain
// verifies through it; an edited record is still decoded (and unverified),
// a line that is not a record is passed with its reason, and the chain
// summary names the first break (THREATS F12, the reading side).
func TestScan(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	recs := writeLog(t, path, 5, "decision")

	scan := func() (Chain, []Entry) {
		t.Helper()
		var es []Entry
		ch, err := Scan(path, func(e Entry) { e.Raw = bytes.Clone(e.Raw); es = append(es, e) })
		if err != nil {
			t.Fatal(err)
		}
		return ch, es
	}
	ch, es := scan()
	if ch.Break != nil || ch.Verified != 5 || ch.Lines != 5 || ch.Head != (Head{Seq: 5, Hash: recs[4].Hash}) || len(es) != 5 {
		t.Fatalf("intact: %+v, %d entries", ch, len(es))
	}
	for i, e := range es {
		if !e.Verified || e.Err != "" || e.Record.Seq != uint64(i+1) || e.Line != i+1 || e.Record.Hash != recs[i].Hash {
			t.Fatalf("entry %d: %+v", i, e)
		}
	}

	// Edit record 3's event and put a line of garbage after record 4.
	data, _ := os.ReadFile(path)
	lines := strings.SplitAfter(string(data), "\n")
	lines[2] = strings.Replace(lines[2], `"event":"decision"`, `"event":"decisiox"`, 1)
	lines = append(lines[:4], append([]string{"not json at all\n"}, lines[4:]...)...)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "")), 0o600); err != nil {
		t.Fatal(err)
	}
	ch, es = scan()
	if ch.Break == nil || ch.Break.Line != 3 || !strings.Contains(ch.Break.Reason, "hash mismatch") || ch.Verified != 2 ||
		ch.Head != (Head{Seq: 2, Hash: recs[1].Hash}) || ch.Lines != 6 {
		t.Fatalf("tampered: %+v (break %+v)", ch, ch.Break)
	}
	if len(es) != 6 {
		t.Fatalf("%d entries, want all 6 lines", len(es))
	}
	if e := es[2]; e.Verified || e.Err != "" || e.Record.Event != "decisiox" {
		t.Fatalf("the edited record: %+v", e)
	}
	if e := es[4]; e.Verified || !strings.HasPrefix(e.Err, "not a record") || string(e.Raw) != "not json at all" {
		t.Fatalf("the garbage line: %+v", e)
	}
	if e := es[5]; e.Verified || e.Err != "" || e.Record.Seq != 5 {
		t.Fatalf("the record after the garbage: %+v", e)
	}
	if s := ch.String(); !strings.Contains(s, "BROKEN at line 3") {
		t.Fatalf("summary %q", s)
	}
}
