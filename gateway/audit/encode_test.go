package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

// sameAsJSON fails t unless appendRecord's bytes are json.Marshal's, or
// appendRecord declines (then encode uses json.Marshal itself).
func sameAsJSON(t *testing.T, rec Record, wantFast bool) {
	t.Helper()
	want, err := json.Marshal(rec)
	if err != nil {
		t.Fatalf("json.Marshal: %v", err)
	}
	got, ok := appendRecord(nil, &rec)
	if ok != wantFast {
		t.Fatalf("appendRecord handled = %v, want %v", ok, wantFast)
	}
	if ok && !bytes.Equal(got, want) {
		t.Fatalf("appendRecord differs from encoding/json:\n got %s\nwant %s", got, want)
	}
}

func TestAppendRecordMatchesEncodingJSON(t *testing.T) {
	at := time.Date(2026, 11, 30, 4, 5, 6, 789000000, time.UTC)
	cases := []struct {
		name     string
		rec      Record
		wantFast bool
	}{
		{"egress decision", Record{Seq: 7, Time: at, Prev: ZeroHash, RequestID: "req_01", Event: "decision", Fields: map[string]any{
			"sandbox": "sb-1", "agent": "agent-a", "session": "s-1", "user": "alice", "kind": "http", "dest_host": "pkg.example",
			"port": 80, "resolved_ip": "93.184.216.34", "decision": "allow", "rule": "egress", "reason": "", "status": 200,
			"bytes_up": int64(0), "bytes_down": int64(1) << 40, "duration_ms": int64(3)}}, true},
		{"no fields", Record{Seq: 1, Time: at, Prev: ZeroHash, Event: "x"}, true},
		{"replica", Record{Seq: 2, Time: at, Prev: ZeroHash, Event: "x", Replica: "gw-1<&>", Fields: map[string]any{"a": 1}}, true},
		{"empty fields map is omitted", Record{Time: at, Fields: map[string]any{}}, true},
		{"escapes", Record{Time: at, RequestID: "a\"b\\c\n\r\t\b\f\x00\x1f\x7f<>&", Event: "\u2028\u2029é😀", Fields: map[string]any{
			"bad utf8": "\xff\xfe ok \xc3", "<key>": "&", "nil": nil, "t": true, "f": false, "u": uint64(1) << 63, "neg": -5}}, true},
		{"whole nanoseconds and zeros", Record{Time: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}, true},
		{"a hash present", Record{Time: at, Hash: "ab"}, true},
		{"float falls back", Record{Time: at, Fields: map[string]any{"ms": 1.5}}, false},
		{"nested map falls back", Record{Time: at, Fields: map[string]any{"m": map[string]any{"a": 1}}}, false},
		{"slice falls back", Record{Time: at, Fields: map[string]any{"l": []string{"a"}}}, false},
		{"int32 falls back", Record{Time: at, Fields: map[string]any{"n": int32(3)}}, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) { sameAsJSON(t, tc.rec, tc.wantFast) })
	}
}

func FuzzAppendRecord(f *testing.F) {
	f.Add("req_1", "decision", "dest_host", "pkg.example", int64(80), uint64(1), int64(1764475506))       // a plain egress record
	f.Add("a\"b\\c\n", "\u2028", "<k>&", "\xff\xfe\x00\x7f", int64(-1), uint64(1)<<63, int64(0))          // every escape class
	f.Add("", "", "", "", int64(0), uint64(0), int64(253402300799))                                       // empties; last second of year 9999
	f.Add("é😀", "\u2029", "\x1f", "\xed\xa0\x80 surrogate", int64(1)<<62, uint64(9), int64(-62135596800)) // non-ASCII; year 1
	f.Fuzz(func(t *testing.T, rid, event, key, val string, n int64, seq uint64, unix int64) {
		rec := Record{Seq: seq, Time: time.Unix(unix, n&0x3fffffff).UTC(), Prev: ZeroHash, RequestID: rid, Event: event,
			Fields: map[string]any{key: val, key + "_n": n, "b": n%2 == 0}}
		want, err := json.Marshal(rec)
		got, ok := appendRecord(nil, &rec)
		if err != nil {
			if ok {
				t.Fatalf("json.Marshal refuses (%v) but appendRecord encoded %s", err, got)
			}
			return
		}
		if !ok {
			t.Fatalf("appendRecord declined a record json.Marshal encodes: %s", want)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("differs:\n got %s\nwant %s", got, want)
		}
		// The same fields as sorted pairs encode to the same bytes.
		keys := slices.Sorted(maps.Keys(rec.Fields))
		sorted := rec
		sorted.Fields = nil
		for _, k := range keys {
			sorted.Sorted = append(sorted.Sorted, Field{k, rec.Fields[k]})
		}
		if got2, ok := appendRecord(nil, &sorted); !ok || !bytes.Equal(got2, want) {
			t.Fatalf("from sorted pairs (ok %v):\n got %s\nwant %s", ok, got2, want)
		}
		// The writer's line from the body Append encoded is the line it
		// makes from the whole record.
		l := &Log{now: func() time.Time { return rec.Time }}
		body, ok := appendRecordBody(nil, &rec)
		if !ok {
			t.Fatalf("appendRecordBody declined what appendRecord encoded: %s", want)
		}
		whole, _, err1 := l.encode(rec, nil, rec.Seq, rec.Prev)
		split, out, err2 := l.encode(rec, body, rec.Seq, rec.Prev)
		if err1 != nil || err2 != nil || !bytes.Equal(whole, split) {
			t.Fatalf("encode with the body differs (%v, %v):\n got %s\nwant %s", err2, err1, split, whole)
		}
		if _, err := VerifyFrom(bytes.NewReader(split), rec.Seq, rec.Prev); err != nil || out.Hash == "" {
			t.Fatalf("the line from the body does not verify: %v\n%s", err, split)
		}
	})
}

// BenchmarkEncode compares the record encoder with json.Marshal on an
// egress decision record.
func BenchmarkEncode(b *testing.B) {
	rec := Record{Seq: 7, Time: time.Now().UTC(), Prev: ZeroHash, RequestID: "req_01", Event: "decision", Fields: map[string]any{
		"sandbox": "sb-1", "agent": "agent-a", "session": "s-1", "user": "alice", "kind": "http", "dest_host": "pkg.example",
		"port": 80, "resolved_ip": "93.184.216.34", "decision": "allow", "rule": "egress", "reason": "", "status": 200}}
	b.Run("appendRecord", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, ok := appendRecord(make([]byte, 0, 512), &rec); !ok {
				b.Fatal("declined")
			}
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		b.ReportAllocs()
		for range b.N {
			if _, err := json.Marshal(rec); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// TestSortedFieldsAppend: a record handed over as sorted pairs is written
// as the same line as with the map; pairs out of order, a key twice, a
// value the fast encoder declines, or pairs beside a map are folded into
// the map first, and the line is still the map's.
func TestSortedFieldsAppend(t *testing.T) {
	at := time.Date(2026, 11, 30, 10, 0, 0, 123, time.UTC)
	cases := []struct {
		name   string
		sorted []Field
		fields map[string]any
	}{
		{"in order", []Field{{"agent", "a"}, {"bytes_up", int64(5)}, {"port", 80}}, nil},
		{"out of order", []Field{{"port", 80}, {"agent", "a"}}, nil},
		{"a key twice: the last wins, as in a map", []Field{{"agent", "a"}, {"agent", "b"}}, nil},
		{"a float", []Field{{"agent", "a"}, {"ms", 1.5}}, nil},
		{"beside a map", []Field{{"agent", "a"}}, map[string]any{"tool": "t"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// The expected line: the same record with a map.
			m := map[string]any{}
			for k, v := range tc.fields {
				m[k] = v
			}
			for _, f := range tc.sorted {
				m[f.Key] = f.Value
			}
			dir := t.TempDir()
			logs := map[string]Record{
				"sorted": {RequestID: "r", Event: "e", Sorted: tc.sorted, Fields: tc.fields},
				"map":    {RequestID: "r", Event: "e", Fields: m},
			}
			lines := map[string]string{}
			for name, rec := range logs {
				l, err := Open(filepath.Join(dir, name+".log"))
				if err != nil {
					t.Fatal(err)
				}
				l.now = func() time.Time { return at }
				if _, err := l.Append(context.Background(), rec); err != nil {
					t.Fatal(err)
				}
				must(t, l.Close())
				lines[name] = readString(t, filepath.Join(dir, name+".log"))
			}
			if lines["sorted"] != lines["map"] {
				t.Fatalf("lines differ:\n sorted %s\n    map %s", lines["sorted"], lines["map"])
			}
		})
	}
}

// A recorded input (json.RawMessage) is taken as is only when the bytes
// are what json.Marshal makes of it; otherwise the record falls back to
// json.Marshal. Either way the line is json.Marshal's.
func FuzzAppendRawJSON(f *testing.F) {
	f.Add(`{"a":1,"b":[true,null,"x y"]}`) // compact, a space inside a string
	f.Add(`{"a": 1}`)                      // whitespace outside strings: Marshal compacts it
	f.Add(`{"h":"<script>&"}`)             // HTML characters: Marshal escapes them
	f.Add("{\"s\":\"\u2028\"}")            // U+2028: Marshal escapes it
	f.Add(`{"s":"\"\\"}`)                  // escaped quote and backslash inside a string
	f.Add(`{"a":`)                         // not JSON: Marshal refuses
	f.Fuzz(func(t *testing.T, raw string) {
		rec := Record{Seq: 1, Time: time.Unix(0, 0).UTC(), Prev: ZeroHash, Event: "decision",
			Sorted: []Field{{"input", json.RawMessage(raw)}}}
		want, err := json.Marshal(Record{Seq: 1, Time: rec.Time, Prev: ZeroHash, Event: "decision",
			Fields: map[string]any{"input": json.RawMessage(raw)}})
		got, ok := appendRecord(nil, &rec)
		if err != nil {
			if ok {
				t.Fatalf("json.Marshal refuses (%v) but appendRecord encoded %s", err, got)
			}
			return
		}
		if ok && !bytes.Equal(got, want) {
			t.Fatalf("differs:\n got %s\nwant %s", got, want)
		}
	})
}

func TestAppendRawJSONFastPath(t *testing.T) {
	rec := Record{Time: time.Unix(0, 0).UTC(), Sorted: []Field{{"input", json.RawMessage(`{"args":{"body":{"reason":"a b"}}}`)}}}
	if _, ok := appendRecord(nil, &rec); !ok {
		t.Fatal("a compact recorded input should be appended as is, not re-encoded")
	}
}

// encodedJSON stands for call.EncodedJSON (audit does not import call).
type encodedJSON []byte

func (j encodedJSON) EncodedJSON() []byte          { return j }
func (j encodedJSON) MarshalJSON() ([]byte, error) { return j, nil }

// The gateway's own encoding (Encoded) is written as it is, with no
// second scan: bytes the json.RawMessage path would refuse to take as is
// (whitespace outside strings) go into the line unchanged, which shows
// nothing looked at them. Compact bytes come out the same through the
// encoding/json fallback, so the line is json.Marshal's either way.
func TestAppendEncodedAsIs(t *testing.T) {
	odd := `{"a": 1}`
	rec := Record{Time: time.Unix(0, 0).UTC(), Sorted: []Field{{"input", encodedJSON(odd)}}}
	got, ok := appendRecord(nil, &rec)
	if !ok || !bytes.Contains(got, []byte(`"input":`+odd)) {
		t.Fatalf("an Encoded value must be appended as is: ok %v, %s", ok, got)
	}
	in := `{"args":{"body":{"reason":"a b"}},"tool":"t.x"}`
	fast, ok := appendRecord(nil, &Record{Seq: 1, Time: rec.Time, Prev: ZeroHash, Event: "decision",
		Sorted: []Field{{"input", encodedJSON(in)}}})
	want, err := json.Marshal(Record{Seq: 1, Time: rec.Time, Prev: ZeroHash, Event: "decision",
		Fields: map[string]any{"input": encodedJSON(in)}})
	if !ok || err != nil || !bytes.Equal(fast, want) {
		t.Fatalf("fast %s (ok %v)\nwant %s (%v)", fast, ok, want, err)
	}
}

// BenchmarkAppendInput: a decision record with an Envoy Check's recorded
// input (about 1.3 KB), as a json.RawMessage (scanned twice before it is
// taken) and as the gateway's own encoding (Encoded: taken as is).
func BenchmarkAppendInput(b *testing.B) {
	in := `{"version":1,"kind":"http","agent":"agent-a","session":"s-1","user":"alice","sandbox":"sb-1",` +
		`"request":{"method":"GET","host":"api.example.test","path":"/v1/items/42","query":{"page":["2"]},` +
		`"headers":{"accept":["application/json"],"user-agent":["curl/8.5.0"],"x-request-id":["7d1c0b3e-2f4a-4b7c-9e21-5a6d8f0c1b2a"]}},` +
		`"envoy":{"attributes":{"source":{"address":{"socketAddress":{"address":"10.0.0.7","portValue":41234}},"principal":"spiffe://sluice/agent-a"},` +
		`"destination":{"address":{"socketAddress":{"address":"10.0.0.9","portValue":8080}}},"request":{"time":"2026-12-02T17:00:00Z",` +
		`"http":{"id":"1234567890","method":"GET","headers":{":authority":"api.example.test",":method":"GET",":path":"/v1/items/42?page=2",` +
		`"accept":"application/json","user-agent":"curl/8.5.0","x-request-id":"7d1c0b3e-2f4a-4b7c-9e21-5a6d8f0c1b2a"},` +
		`"path":"/v1/items/42?page=2","host":"api.example.test","scheme":"http","protocol":"HTTP/1.1"}},` +
		`"contextExtensions":{"agent":"agent-a","sandbox":"sb-1","session":"s-1","user":"alice"}},` +
		`"parsed_path":["v1","items","42"],"parsed_query":{"page":["2"]},"parsed_body":null}}`
	for _, row := range []struct {
		name string
		v    any
	}{{"raw", json.RawMessage(in)}, {"encoded", encodedJSON(in)}} {
		b.Run(row.name, func(b *testing.B) {
			rec := Record{Seq: 7, Time: time.Now().UTC(), Prev: ZeroHash, RequestID: "req_01", Event: "decision",
				Sorted: []Field{{"agent", "agent-a"}, {"decision", "allow"}, {"input", row.v}, {"kind", "http"}}}
			buf := make([]byte, 0, 4096)
			b.ReportAllocs()
			for range b.N {
				var ok bool
				if buf, ok = appendRecord(buf[:0], &rec); !ok {
					b.Fatal("declined")
				}
			}
		})
	}
}
