package egress

import (
	"context"
	"strconv"
	"sync"

	mdns "github.com/miekg/dns"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-gw/sluice/policy"
)

// dnsDecisions caches policy decisions of kind "dns" per (caller, name)
// (decision_cache.go). Every question is still decided by policy, so a
// refusal stays a refusal, with no upstream query, and is audited per
// question as before.
type dnsDecisions = decisionCache[dnsDecisionKey]

type dnsDecisionKey struct {
	caller policy.Caller
	host   string
}

// allowDNS decides host for c like decide (proxy.go) with kind "dns", at
// c.Start, through the decision cache: on a miss the same input document (the caller and
// the name) goes to policy. c carries the decision for the audit record
// of a refusal either way.
func (e *Proxy) allowDNS(ctx context.Context, c *egressCall, host string) bool {
	if NarrowedOut(c.caller, host) { // narrow.go: before policy and its cache
		c.decide(NarrowDecision)
		return false
	}
	eng := e.d.Engine()
	v := eng.Version()
	k := dnsDecisionKey{caller: c.caller, host: host}
	now := c.Start
	st := e.subs.state
	d, ok := st.decisions.get(eng, v, k, now)
	if !ok {
		in := &policy.Input{Version: policy.InputVersion, Kind: c.Kind.String(), Caller: c.caller, Request: policy.Request{Host: host}, Time: now.UTC()}
		d = eng.Decide(ctx, in)
		st.decisions.put(eng, v, k, d, now)
	}
	c.decide(d)
	e.d.Decisions.Add(context.Background(), 1, st.decOpts.get(d.Action.String(), e.d.RuleLabel(d.Rule))) // no span: see reply in answer
	return d.Action == policy.Allow
}

// dnsState is the answerer's per-server state besides the exfiltration
// counters: the decision cache, the precomputed metric options and the
// stream workers per sandbox. It hangs
// off subdomains because New builds that once per server.
type dnsState struct {
	decisions dnsDecisions
	decOpts   decisionOpts
	rcodeOpts [24]metric.AddOption // sluice.dns.answers{rcode}, by rcode

	workersMu sync.Mutex
	workers   map[string]int // stream workers per sandbox (dns_stream.go)
}

func newDNSState() *dnsState {
	st := &dnsState{}
	for rc := range st.rcodeOpts {
		name := mdns.RcodeToString[rc]
		if name == "" {
			name = strconv.Itoa(rc)
		}
		st.rcodeOpts[rc] = metric.WithAttributes(attribute.String("rcode", name))
	}
	return st
}

// rcodeOpt is the metric option of rcode.
func (st *dnsState) rcodeOpt(rcode int) metric.AddOption {
	if rcode >= 0 && rcode < len(st.rcodeOpts) {
		return st.rcodeOpts[rcode]
	}
	return metric.WithAttributes(attribute.String("rcode", mdns.RcodeToString[rcode]))
}
