package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// decodeLine is checkLineLight's strict decoder path, for comparison.
func decodeLine(line []byte) (Line, bool) {
	var rec Line
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	ok := dec.Decode(&rec) == nil && !dec.More() && dec.InputOffset() == int64(len(line))
	if len(rec.Fields) == 0 {
		rec.Fields = nil
	}
	return rec, ok
}

// writtenLines are lines as the writer writes them: fields of every
// kind, none at all, a replica, strings the envelope leaves to the
// decoder (escapes, non-ASCII).
func writtenLines(t testing.TB) [][]byte {
	path := filepath.Join(t.TempDir(), "audit.log")
	write := func(o Options, recs ...Record) {
		l, err := OpenWith(path, o)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range recs {
			if _, err := l.Append(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(Options{},
		Record{RequestID: "r1", Event: "decision", Fields: map[string]any{"tool": "t.x", "n": 1, "input": json.RawMessage(`{"a":[1,2,{"b":null}]}`)}},
		Record{RequestID: "r2", Event: "result"},
		Record{RequestID: "r\"3\\", Event: "décision", Fields: map[string]any{"s": "a\"b\\c\u2028é\x01"}},
		Record{RequestID: "r4", Event: "decision", Sorted: []Field{{"agent", "a"}, {"decision", "allow"}}},
	)
	write(Options{Replica: "replica-1"}, Record{RequestID: "r5", Event: "decision", Fields: map[string]any{"k": "v"}})
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return bytes.Split(bytes.TrimSuffix(b, []byte("\n")), []byte("\n"))
}

// TestEnvelopeMatchesDecoder: on the writer's lines the envelope reads
// what the strict decoder reads, and takes the plain ones itself.
func TestEnvelopeMatchesDecoder(t *testing.T) {
	plain := 0
	for _, line := range writtenLines(t) {
		want, ok := decodeLine(line)
		if !ok {
			t.Fatalf("the decoder refuses a written line: %s", line)
		}
		var got Line
		if envelope(line, &got) {
			plain++
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("%s:\nenvelope %+v\ndecoder  %+v", line, got, want)
			}
		}
		if r := checkLineLight(line, &got); r != "" {
			t.Fatalf("checkLineLight refuses a written line: %s: %s", r, line)
		}
	}
	if plain < 4 {
		t.Fatalf("the envelope took %d of the written lines, want at least the 4 without escapes", plain)
	}
}

// FuzzEnvelope: whatever the envelope accepts, the decoder accepts with
// the same Line.
func FuzzEnvelope(f *testing.F) {
	for _, line := range writtenLines(f) {
		f.Add(line) // the writer's layout
	}
	f.Add([]byte(`{"seq":01,"time":"2026-01-01T00:00:00Z","prev":"","request_id":"","event":"","hash":"` + string(bytes.Repeat([]byte("0"), 64)) + `"}`)) // a leading zero
	f.Fuzz(func(t *testing.T, line []byte) {
		var got Line
		if !envelope(line, &got) {
			return
		}
		want, ok := decodeLine(line)
		if !ok {
			t.Fatalf("envelope accepts what the decoder refuses: %q", line)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\nenvelope %+v\ndecoder  %+v", line, got, want)
		}
	})
}
