package egress

import (
	"context"
	"net/netip"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// answerFast answers, on a stream's reader without a worker, the one
// question it can answer without waiting and without unpacking it with
// miekg/dns: a plain query (dns.ParseQuery) of class IN for a name whose
// allow decision for this caller is in the decision cache and that is not
// refused by name, and, for A and AAAA, whose addresses are in the
// resolver's cache and all pass the guard. It appends the answer to dst and
// reports true, after the same accounting as answer: the exfiltration
// signals (countName), the dns_answered record of a session's first
// question of a name (dnsAnswered), sluice.decisions and
// sluice.dns.answers. For anything else it does nothing and reports false,
// and the question goes
// to answer on a worker — unusual messages, NOTIMP types, refusals (which
// are audited), decisions to evaluate and names to resolve upstream.
//
// The answer is what answer would say, in the shape dns.AppendAnswer
// writes: the query's ID, RD and CD and question as asked (case too), RA,
// and the records' owner a pointer to the question's name; the TTL is the
// seconds left of the cached records, capped at answerTTL, as in answer.
//
// With tally set, the two counters are added up in tally and reach the
// meters at tally.flush (the stream flushes it before each write of
// answers): one Add per batch instead of two per question.
func (e answerer) answerFast(ctx context.Context, id wire.Identity, raw, dst []byte, tally *dnsTally) ([]byte, bool) {
	q, ok := dns.ParseQuery(raw)
	if !ok || q.Class != mdns.ClassINET {
		return dst, false
	}
	switch q.Type {
	case mdns.TypeTXT, mdns.TypeNULL, mdns.TypeANY, mdns.TypeAXFR, mdns.TypeIXFR:
		return dst, false
	}
	var nb [256]byte
	name := string(dns.AppendName(nb[:0], q.Name))
	caller := CallerOf(id)
	now := time.Now()
	eng := e.d.Engine()
	st := e.subs.state
	d, ok := st.decisions.get(eng, eng.Version(), dnsDecisionKey{caller: caller, host: name}, now)
	if !ok || d.Action != policy.Allow || guard.NameClass(name) != guard.Public || NarrowedOut(caller, name) {
		return dst, false
	}
	if caller.Session != "" {
		if e.d.Session(ctx, caller.Session) != nil {
			return dst, false // answer refuses it, audited (sessionGate)
		}
	}
	var (
		addrs []netip.Addr
		ttl   uint32
	)
	if q.Type == mdns.TypeA || q.Type == mdns.TypeAAAA {
		if e.res == nil {
			return dst, false
		}
		if addrs, ttl, ok = e.res.Cached(name, q.Type); !ok || len(addrs) == 0 {
			return dst, false
		}
		for _, a := range addrs {
			if e.dialer.Check(name, a, nil) != nil {
				return dst, false // refused and audited on the full path
			}
		}
	}
	c := newEgressCall("", now, call.KindDNS)
	c.setCaller(caller)
	c.setListener(ctx, e.d.Hosted)
	c.DestHost = name
	c.decide(d)
	e.countName(ctx, c, name)
	if c.firstAsk {
		e.dnsAnswered(ctx, c, q.Type, mdns.RcodeSuccess, len(addrs))
	}
	if tally == nil {
		tally = &dnsTally{}
		defer tally.flush(e.Proxy)
	}
	tally.count(e.Proxy, d)
	return dns.AppendAnswer(dst, &q, mdns.RcodeSuccess, addrs, min(ttl, answerTTL)), true
}

// dnsTally adds up the inline answerer's counts of sluice.decisions (as
// allowDNS counts them) and sluice.dns.answers{rcode=NOERROR} (as answer
// counts them) between two flushes.
type dnsTally struct {
	action, rule string // the decision counted in decisions
	decisions    int64
	answers      int64
}

// count counts one allowed question decided d and answered NOERROR.
func (t *dnsTally) count(e *Proxy, d policy.Decision) {
	action := d.Action.String()
	if t.decisions > 0 && (t.action != action || t.rule != d.Rule) {
		t.flushDecisions(e)
	}
	t.action, t.rule = action, d.Rule
	t.decisions++
	t.answers++
}

// flush adds the counts to the meters and resets them.
func (t *dnsTally) flush(e *Proxy) {
	t.flushDecisions(e)
	if t.answers > 0 {
		// No span to attach as an exemplar: see reply in answer.
		e.dnsAnswers.Add(context.Background(), t.answers, e.subs.state.rcodeOpt(mdns.RcodeSuccess))
		t.answers = 0
	}
}

func (t *dnsTally) flushDecisions(e *Proxy) {
	if t.decisions > 0 {
		e.d.Decisions.Add(context.Background(), t.decisions, e.subs.state.decOpts.get(t.action, e.d.RuleLabel(t.rule)))
		t.decisions = 0
	}
}
