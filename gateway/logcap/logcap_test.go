package logcap

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"
	"time"
)

// sink receives the limiter's log lines (written from its timers).
type sink chan []byte

func (s sink) Write(p []byte) (int, error) {
	s <- bytes.Clone(p)
	return len(p), nil
}

// logLines decodes the JSON lines written to s so far, those of earlier
// calls included (seen).
func logLines(t *testing.T, s sink, seen *[]map[string]any) []map[string]any {
	t.Helper()
	for {
		select {
		case ln := <-s:
			var m map[string]any
			if err := json.Unmarshal(ln, &m); err != nil {
				t.Fatalf("log line %q: %v", ln, err)
			}
			*seen = append(*seen, m)
		default:
			return *seen
		}
	}
}

// TestRepeatLimiter: a line repeated 1,000 times in an interval is logged
// once and then counted in one log_repeated line; another reason is its
// own line; after a quiet interval the line is logged whole again.
func TestRepeatLimiter(t *testing.T) {
	buf, seen := make(sink, 64), []map[string]any{}
	l := New(slog.New(slog.NewJSONHandler(buf, nil)), 200*time.Millisecond)
	defer l.Stop()
	allowed := 0
	for range 1000 {
		if l.Allow("tool_call", "audit_unavailable: no space left on device") {
			allowed++
		}
	}
	if allowed != 1 {
		t.Fatalf("%d of 1000 identical lines allowed in one interval, want 1", allowed)
	}
	if !l.Allow("tool_call", "audit_unavailable: input/output error") {
		t.Errorf("a line with another reason was suppressed")
	}
	deadline := time.Now().Add(5 * time.Second)
	var rep []map[string]any
	for time.Now().Before(deadline) && len(rep) == 0 {
		time.Sleep(20 * time.Millisecond)
		for _, m := range logLines(t, buf, &seen) {
			if m["msg"] == "log_repeated" {
				rep = append(rep, m)
			}
		}
	}
	if len(rep) != 1 || rep[0]["count"] != float64(999) || rep[0]["line"] != "tool_call" ||
		rep[0]["reason"] != "audit_unavailable: no space left on device" || rep[0]["interval_s"] != 0.2 {
		t.Fatalf("log_repeated lines %v, want one counting 999 tool_call lines", rep)
	}
	// The next interval had none: the key ends, and the line is whole again.
	time.Sleep(3 * l.every)
	if !l.Allow("tool_call", "audit_unavailable: no space left on device") {
		t.Errorf("the line after a quiet interval was suppressed")
	}
	for _, m := range logLines(t, buf, &seen) {
		if m["msg"] == "log_repeated" && m["count"] != float64(999) {
			t.Errorf("unexpected count line %v", m)
		}
	}
}
