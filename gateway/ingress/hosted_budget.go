package ingress

import (
	"net"
	"net/netip"
	"sync"
	"time"
)

// The hosted listener may face more than sandboxes, and every refused
// attempt that names no token (no credential, or none whose MAC
// verified) would otherwise be one audit record: anyone who can reach
// the port could grow the audit log without bound. Each source address
// therefore has a budget of such refusals audited one by one per window
// (HostedOptions.RefusalBudget, .RefusalWindow); past it, a refusal is
// still answered 407 and counted (HostedOptions.Unaudited: the metrics),
// and what the address did past its budget is audited once, as a
// HostedSummary, when its window ends. A refusal of a real token
// (expired, ended, another session's, changed) is always audited: only
// the platform can mint one.

// HostedSummary is one source address's refusals past its budget in one
// window: audited once, instead of each.
type HostedSummary struct {
	Remote    string // the source address (no port); "other" for addresses past maxBudgetAddrs
	Unaudited int    // refusals past the budget, answered but not audited each
	From, To  time.Time
}

// Defaults of HostedOptions.RefusalBudget and .RefusalWindow.
const (
	DefaultRefusalBudget = 20
	DefaultRefusalWindow = time.Minute
)

// maxBudgetAddrs bounds the addresses tracked at once; refusals from
// more addresses in one window share the budget of "other".
const maxBudgetAddrs = 4096

// refusalBudget is the per-source-address budget of audited refusals.
type refusalBudget struct {
	per    int
	window time.Duration
	now    func() time.Time

	mu    sync.Mutex
	addrs map[netip.Addr]*budgetWindow // the zero Addr is "other"
	swept time.Time
}

type budgetWindow struct {
	start time.Time
	n     int // refusals in the window, audited or not
}

func newRefusalBudget(per int, window time.Duration, now func() time.Time) *refusalBudget {
	if per <= 0 {
		per = DefaultRefusalBudget
	}
	if window <= 0 {
		window = DefaultRefusalWindow
	}
	return &refusalBudget{per: per, window: window, now: now, addrs: map[netip.Addr]*budgetWindow{}}
}

// take counts one refusal from remote (host:port): audit says whether it
// is audited on its own; done are the summaries of windows that have
// ended (the caller audits them).
func (b *refusalBudget) take(remote string) (audit bool, done []HostedSummary) {
	addr := sourceAddr(remote)
	now := b.now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.swept) >= b.window {
		done = b.sweep(now, false)
	}
	w := b.addrs[addr]
	if w == nil {
		if len(b.addrs) >= maxBudgetAddrs {
			addr = netip.Addr{}
			w = b.addrs[addr]
		}
		if w == nil {
			w = &budgetWindow{start: now}
			b.addrs[addr] = w
		}
	}
	if now.Sub(w.start) >= b.window {
		if s, ok := b.summary(addr, w); ok {
			done = append(done, s)
		}
		*w = budgetWindow{start: now}
	}
	w.n++
	return w.n <= b.per, done
}

// sweep forgets the addresses whose window ended (all of them with
// all), returning the summaries of those that went past the budget.
func (b *refusalBudget) sweep(now time.Time, all bool) []HostedSummary {
	b.swept = now
	var done []HostedSummary
	for addr, w := range b.addrs {
		if !all && now.Sub(w.start) < b.window {
			continue
		}
		if s, ok := b.summary(addr, w); ok {
			done = append(done, s)
		}
		delete(b.addrs, addr)
	}
	return done
}

// flush ends every window now (the listener closes).
func (b *refusalBudget) flush() []HostedSummary {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sweep(b.now(), true)
}

func (b *refusalBudget) summary(addr netip.Addr, w *budgetWindow) (HostedSummary, bool) {
	if w.n <= b.per {
		return HostedSummary{}, false
	}
	remote := "other"
	if addr.IsValid() {
		remote = addr.String()
	}
	return HostedSummary{Remote: remote, Unaudited: w.n - b.per, From: w.start, To: w.start.Add(b.window)}, true
}

// sourceAddr is remote's address without its port (a new connection has
// a new port); unparsable, it is "other".
func sourceAddr(remote string) netip.Addr {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}
	}
	return a.Unmap().WithZone("")
}
