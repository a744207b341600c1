package gateway

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/policy"
)

func TestEncodeInputCuts(t *testing.T) {
	big := strings.Repeat("x", 2000)
	in := func(body any, hdr string) *policy.Input {
		return &policy.Input{Kind: "tool_call", Tool: "t.x",
			Args:    map[string]any{"path": map[string]any{}, "query": map[string]any{}, "headers": map[string]any{}, "body": body},
			Request: policy.Request{Method: "POST", Host: "h", Path: "/x", Headers: map[string][]string{"X-Note": {hdr}}}}
	}
	for _, c := range []struct {
		name    string
		in      *policy.Input
		cut     string
		hasBody bool
	}{
		{"fits", in(map[string]any{"amount": 5}, "n"), "", true},
		{"body too large: bodies cut", in(map[string]any{"note": big}, "n"), "args.body,request.body", false},
		{"still too large without bodies: nothing kept", in("b", big), "input", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			raw, cut, size := encodeInput(c.in, 1000)
			full, _ := json.Marshal(c.in)
			if cut != c.cut {
				t.Fatalf("cut %q, want %q", cut, c.cut)
			}
			// The audit log writes the recorded input unchecked
			// (call.EncodedJSON): it must be compact, escaped, valid JSON.
			if c, err := json.Marshal(json.RawMessage(raw)); raw != nil && (err != nil || string(c) != string(raw)) {
				t.Fatalf("recorded input is not json.Marshal's bytes: %v\n%s\n%s", err, raw, c)
			}
			if cut == "" && (size != 0 || string(raw) != string(full)) {
				t.Fatalf("an input within the cap is recorded whole: size %d, %s", size, raw)
			}
			if cut != "" && size != len(full) {
				t.Fatalf("size %d, want the size before the cut %d", size, len(full))
			}
			if cut == "input" && raw != nil || len(raw) > 1000 {
				t.Fatalf("recorded %d bytes over the cap (or a whole cut with bytes)", len(raw))
			}
			if cut == "args.body,request.body" {
				d, err := policy.DecodeInput(raw)
				if err != nil || d.Args.(map[string]any)["body"] != nil || d.Tool != "t.x" {
					t.Fatalf("cut input must decode, keep the rest and have no body: %v %+v", err, d)
				}
			}
		})
	}
}
