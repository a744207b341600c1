package egress

import (
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
