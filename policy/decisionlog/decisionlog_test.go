package decisionlog

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

func event(i int) Event {
	in := map[string]any{
		"kind": "tool_call", "tool": "billing-api.create_charge",
		"caller":  map[string]any{"agent": "support-bot", "user": "bob", "session": "s1", "sandbox": "sb1"},
		"args":    map[string]any{"body": map[string]any{"card_number": "4242424242424242", "amount": i}},
		"request": map[string]any{"method": "POST", "host": "billing.example.com"},
	}
	b, _ := json.Marshal(in)
	return Event{DecisionID: NewDecisionID(), Path: "sluice/main/decision", Input: b,
		Result:   map[string]any{"action": "allow", "rule": "policies[0]", "reason": "ok"},
		Revision: "r7", Bundles: map[string]Bundle{"sluice": {Revision: "r7"}},
		Timestamp: time.Unix(1700000000, 0).UTC(), RequestID: "req-1"}
}

func TestMask(t *testing.T) {
	x, err := New(Config{File: "/dev/null", Mask: []string{
		"/input/args/body/card_number", // present: erased
		"/input/args/body/cvc",         // absent: skipped, not listed
		"/input/caller/user",
		"/result/reason",
	}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := x.Encode(event(1))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), "4242424242424242") || strings.Contains(string(b), `"bob"`) {
		t.Fatalf("masked fields leaked: %s", b)
	}
	var got Event
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := []string{"/input/args/body/card_number", "/input/caller/user", "/result/reason"}
	if strings.Join(got.Erased, ",") != strings.Join(want, ",") {
		t.Fatalf("erased = %v, want %v", got.Erased, want)
	}
	if !strings.Contains(string(got.Input), `"amount":1`) || got.DecisionID == "" || got.Labels != nil && len(got.Labels) != 0 {
		t.Fatalf("unmasked fields changed: %s", b)
	}
	for _, bad := range []string{"input/x", "/input", "/labels/x"} {
		if _, err := New(Config{File: "/dev/null", Mask: []string{bad}}); err == nil {
			t.Errorf("mask %q accepted", bad)
		}
	}
}

// collector is a loopback decision-log collector: it gunzips each batch.
type collector struct {
	mu     sync.Mutex
	events []map[string]any
	delay  time.Duration
	status int
}

func (c *collector) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	time.Sleep(c.delay)
	if r.Header.Get("Content-Encoding") != "gzip" {
		http.Error(w, "want gzip", 400)
		return
	}
	zr, err := gzip.NewReader(r.Body)
	if err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	var batch []map[string]any
	if err := json.NewDecoder(zr).Decode(&batch); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.status != 0 {
		w.WriteHeader(c.status)
		return
	}
	c.events = append(c.events, batch...)
}

func (c *collector) count() int { c.mu.Lock(); defer c.mu.Unlock(); return len(c.events) }

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestCollectorReceivesMaskedBatches(t *testing.T) {
	col := &collector{status: http.StatusServiceUnavailable} // down at first: retried
	srv := httptest.NewServer(col)
	defer srv.Close()
	x, err := New(Config{URL: srv.URL + "/logs", Batch: 10, Flush: 20 * time.Millisecond,
		Mask: []string{"/input/args/body/card_number"}, Labels: map[string]string{"env": "test"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = x.Run(ctx) }()
	for i := range 25 {
		x.Log(event(i))
	}
	waitFor(t, func() bool { return x.Stats().Failed > 0 })
	col.mu.Lock()
	col.status = 0
	col.mu.Unlock()
	waitFor(t, func() bool { return col.count() == 25 })
	cancel()
	<-done
	col.mu.Lock()
	defer col.mu.Unlock()
	seen := map[float64]bool{}
	for _, ev := range col.events {
		in := ev["input"].(map[string]any)
		body := in["args"].(map[string]any)["body"].(map[string]any)
		if _, ok := body["card_number"]; ok {
			t.Fatalf("card_number reached the collector: %v", ev)
		}
		seen[body["amount"].(float64)] = true
		if ev["labels"].(map[string]any)["env"] != "test" || ev["decision_id"] == "" || ev["path"] != "sluice/main/decision" ||
			ev["bundles"].(map[string]any)["sluice"].(map[string]any)["revision"] != "r7" {
			t.Fatalf("event lacks OPA's fields: %v", ev)
		}
	}
	if len(seen) != 25 {
		t.Fatalf("distinct events = %d, want 25 (no duplicates, none lost)", len(seen))
	}
	if st := x.Stats(); st.Sent != 25 || st.Dropped != 0 {
		t.Fatalf("stats = %+v", st)
	}
}

// TestCollectorDownNeverBlocks: with the collector refusing connections
// or hanging, Log stays sub-millisecond and the buffer stays bounded (the
// oldest are dropped and counted).
func TestCollectorDownNeverBlocks(t *testing.T) {
	// A loopback port with nothing listening: every POST is refused.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + l.Addr().String() + "/logs"
	l.Close()
	hang := httptest.NewServer(&collector{delay: 3 * time.Second})
	defer hang.Close()
	for _, tc := range []struct{ name, url string }{{"refused", down}, {"slow", hang.URL}} {
		t.Run(tc.name, func(t *testing.T) {
			x, err := New(Config{URL: tc.url, Buffer: 100, Batch: 10, Flush: 5 * time.Millisecond, Timeout: 2 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = x.Run(ctx) }()
			ev := event(1)
			lat := make([]time.Duration, 0, 5000)
			t0 := time.Now()
			for range 5000 {
				start := time.Now()
				x.Log(ev)
				lat = append(lat, time.Since(start))
			}
			total := time.Since(t0)
			slices.Sort(lat)
			// Log takes a mutex and copies an event: microseconds. The
			// bounds leave room for a loaded machine and -race, and are
			// far below one delivery attempt (Timeout 2s, the slow
			// collector's 3s).
			if p99 := lat[len(lat)*99/100]; p99 > 5*time.Millisecond || total > 2*time.Second {
				t.Errorf("Log with the collector %s: p99 %v, 5000 calls in %v", tc.name, p99, total)
			}
			st := x.Stats()
			if st.Queued > 100 || st.Dropped < 5000-110 {
				t.Fatalf("stats = %+v: want at most 100 queued and the rest dropped", st)
			}
			cancel()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("Run did not return within its final timeout")
			}
		})
	}
}

func TestFileAndOCSF(t *testing.T) {
	p := filepath.Join(t.TempDir(), "decisions.jsonl")
	x, err := New(Config{File: p, Format: "ocsf", Flush: 10 * time.Millisecond, Mask: []string{"/input/args/body/card_number"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = x.Run(ctx) }()
	x.Log(event(3))
	waitFor(t, func() bool { return x.Stats().Sent == 1 })
	cancel()
	<-done
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var ev map[string]any
	if err := json.Unmarshal(b, &ev); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
	if ev["class_uid"] != float64(6003) || ev["activity_id"] != float64(1) || ev["disposition"] != "Allowed" ||
		ev["policy"].(map[string]any)["version"] != "r7" || strings.Contains(string(b), "4242424242424242") {
		t.Fatalf("OCSF event = %s", b)
	}
}
