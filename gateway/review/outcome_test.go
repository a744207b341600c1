package review

import (
	"testing"

	"github.com/sluice-gw/sluice/gateway/holds"
)

// TestOutcome: what a decided hold's page says was sent and answered.
func TestOutcome(t *testing.T) {
	res := func(body string) *holds.Result { return &holds.Result{HTTPStatus: 200, Body: []byte(body)} }
	for _, c := range []struct {
		name string
		h    holds.Hold
		want Outcome
	}{
		{"executed: the upstream's status", holds.Hold{Status: holds.Done, Result: res(`{"status":201,"headers":{},"body":{"id":1},"request_id":"r"}`)},
			Outcome{Sent: true, Upstream: 201, UpstreamText: "Created"}},
		{"executed with an upstream error status", holds.Hold{Status: holds.Done, Result: res(`{"status":401,"body":"no"}`)},
			Outcome{Sent: true, Upstream: 401, UpstreamText: "Unauthorized"}},
		{"blocked on re-evaluation: not sent", holds.Hold{Status: holds.Failed, Result: res(`{"error":{"code":"policy_block","message":"blocked by policies[2]"}}`)},
			Outcome{Code: "policy_block", Message: "blocked by policies[2]"}},
		{"upstream unreachable: sent, failed", holds.Hold{Status: holds.Failed, Result: res(`{"error":{"code":"upstream_error","message":"no answer"}}`)},
			Outcome{Sent: true, Code: "upstream_error", Message: "no answer"}},
		{"denied: nothing sent", holds.Hold{Status: holds.Denied}, Outcome{}},
		{"expired: nothing sent", holds.Hold{Status: holds.Expired}, Outcome{}},
		{"outcome unknown: maybe sent", holds.Hold{Status: holds.Unknown}, Outcome{Sent: true}},
		{"a result that is not JSON", holds.Hold{Status: holds.Done, Result: res(`<html>`)}, Outcome{Sent: true}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := outcome(c.h); got != c.want {
				t.Fatalf("outcome = %+v, want %+v", got, c.want)
			}
		})
	}
}
