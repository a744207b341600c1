package ingress

import (
	"fmt"
	"net/netip"
	"testing"
	"time"
)

// TestRefusalBudget: per source address (the port does not matter), the
// first per refusals of a window are audited and the rest counted; the
// window's end gives one summary of what went past the budget, and
// addresses beyond maxBudgetAddrs share "other"'s budget, so neither
// the audit log nor the table grows with the attempts.
func TestRefusalBudget(t *testing.T) {
	now := time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	b := newRefusalBudget(3, time.Minute, func() time.Time { return now })
	take := func(remote string) (bool, []HostedSummary) { return b.take(remote) }

	var audited int
	for i := range 5 {
		ok, done := take(fmt.Sprintf("192.0.2.1:%d", 40000+i))
		if len(done) != 0 {
			t.Fatalf("summary before the window ended: %v", done)
		}
		if ok {
			audited++
		}
	}
	if ok, _ := take("[::ffff:192.0.2.1]:1"); ok || audited != 3 {
		t.Fatalf("audited %d of 5 (budget 3), and the mapped address was audited %v", audited, ok)
	}
	if ok, _ := take("192.0.2.2:1"); !ok {
		t.Fatal("another address's first refusal was not audited")
	}

	now = now.Add(time.Minute)
	ok, done := take("192.0.2.1:2")
	if !ok || len(done) != 1 || done[0].Remote != "192.0.2.1" || done[0].Unaudited != 3 || !done[0].To.Equal(done[0].From.Add(time.Minute)) {
		t.Fatalf("after the window: audited %v, summaries %+v; want one for 192.0.2.1 with 3", ok, done)
	}
	if _, ok := b.addrs[mustAddr(t, "192.0.2.2")]; ok {
		t.Error("an ended window within its budget was not forgotten")
	}

	for i := range maxBudgetAddrs + 10 {
		take(fmt.Sprintf("10.%d.%d.%d:1", i>>16&255, i>>8&255, i&255))
	}
	if len(b.addrs) > maxBudgetAddrs+1 {
		t.Fatalf("%d addresses tracked, want at most %d and other", len(b.addrs), maxBudgetAddrs)
	}
	sums := b.flush()
	var other int
	for _, s := range sums {
		if s.Remote == "other" {
			other = s.Unaudited
		}
	}
	if other == 0 || len(b.addrs) != 0 {
		t.Fatalf("flush: other's unaudited %d, %d addresses left", other, len(b.addrs))
	}
	if ok, _ := take("not an address"); !ok {
		t.Error("an unparsable remote's first refusal (under other) was not audited")
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
