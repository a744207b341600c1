package limits

import (
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/policy"
)

func TestCallLimitsSweep(t *testing.T) {
	var cl Calls
	rl := &config.RateLimit{PerSecond: 1, Burst: 1}
	now := time.Now()
	a, b := policy.Caller{Sandbox: "a", Agent: "x"}, policy.Caller{Sandbox: "b", Agent: "x"}
	if ok, _ := cl.Allow(a, rl, now); !ok {
		t.Fatal("first call refused")
	}
	if ok, wait := cl.Allow(a, rl, now); ok || wait <= 0 || wait > time.Second {
		t.Fatalf("second call at once: ok %v wait %v, want refused for up to 1s", ok, wait)
	}
	// A refused call takes no token: one second later exactly one is back.
	if ok, _ := cl.Allow(a, rl, now.Add(time.Second)); !ok {
		t.Fatal("refused after the refill")
	}
	cl.Allow(b, rl, now.Add(time.Second))
	cl.Allow(b, rl, now.Add(limiterIdle+2*time.Second)) // sweeps a, idle since now+1s
	if _, ok := cl.m[a]; ok || len(cl.m) != 1 {
		t.Fatalf("after the sweep: %d buckets, a kept %v; want only b", len(cl.m), ok)
	}
	for i := range maxLimitedCallers {
		cl.m[policy.Caller{Sandbox: string(rune(i))}] = &callBucket{used: now.Add(limiterIdle + 2*time.Second)}
	}
	cl.Allow(a, rl, now.Add(limiterIdle+3*time.Second))
	if n := len(cl.m); n > maxLimitedCallers {
		t.Fatalf("%d buckets, want at most %d", n, maxLimitedCallers)
	}
}
