package egress

import (
	"context"
	"errors"
	"io"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluice-gw/sluice/dns"
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/policy/findings"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// maxDNSMessage bounds a question on POST /v1/dns (EDNS0 sizes go to 4096).
const maxDNSMessage = 4096

// answerTTL caps the TTL the sandbox is told.
const answerTTL = 300

// answerer is the Proxy's DNS side: the answers of POST /v1/dns, one
// question at a time or the stub's stream, each question decided with kind
// dns (allowDNS) like every other egress and audited.
type answerer struct{ *Proxy }

// serve is ServeDNS.
func (e answerer) serve(w http.ResponseWriter, r *http.Request) {
	rid := refusal.NewRequestID()
	id, ok := e.d.Identity(r.Context())
	if !ok {
		refusal.Write(w, refusal.New(http.StatusForbidden, refusal.IdentityRequired, "no identity"), rid)
		return
	}
	ct := r.Header.Get("Content-Type")
	if ct == DNSStreamType {
		e.serveDNSStream(w, r, id) // dns_stream.go
		return
	}
	if ct != "application/dns-message" {
		refusal.Write(w, refusal.New(http.StatusUnsupportedMediaType, refusal.SchemaViolation, "want Content-Type: application/dns-message"), rid)
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, maxDNSMessage+1))
	if err != nil || len(raw) > maxDNSMessage {
		refusal.Write(w, refusal.New(http.StatusRequestEntityTooLarge, refusal.SchemaViolation, "a DNS question is at most 4096 bytes"), rid)
		return
	}
	out := e.answer(r.Context(), rid, id, raw)
	w.Header().Set("Content-Type", "application/dns-message")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(out)
}

// answer decides one DNS question and returns the packed answer.
//
//   - unparsable, a response, not exactly one question, a name over 253
//     bytes or with a byte outside letters, digits, '-' and '_' → FORMERR;
//   - opcode other than QUERY, class other than IN, TXT, NULL, ANY, AXFR,
//     IXFR → NOTIMP;
//   - a name the caller's agent may not reach (policy kind "dns") → REFUSED,
//     without asking any upstream;
//   - A/AAAA of an allowed name → resolved upstream; any answer that is an
//     internal or metadata address → REFUSED; upstream failure → SERVFAIL;
//   - other types of an allowed name → NOERROR with no records.
func (e answerer) answer(ctx context.Context, rid string, id wire.Identity, raw []byte) []byte {
	c := newEgressCall(rid, time.Now(), call.KindDNS)
	c.setCaller(CallerOf(id))
	c.setListener(ctx, e.d.Hosted)
	q := new(mdns.Msg)
	reply := func(rcode int, rrs []mdns.RR) []byte {
		m := new(mdns.Msg)
		if len(q.Question) == 1 {
			m.SetReply(q)
		} else {
			m.Id, m.Response, m.Opcode = q.Id, true, q.Opcode
		}
		m.Rcode, m.RecursionAvailable, m.Answer = rcode, true, rrs
		// The metric's context is Background: a DNS answer has no span to
		// attach as an exemplar, and looking one up in the request's
		// context cost more than the rest of a cached answer.
		e.dnsAnswers.Add(context.Background(), 1, e.subs.state.rcodeOpt(rcode))
		if c.firstAsk && rcode != mdns.RcodeRefused { // a refusal has its own record
			e.dnsAnswered(ctx, c, q.Question[0].Qtype, rcode, len(rrs))
		}
		out, err := m.Pack()
		if err != nil {
			m = &mdns.Msg{MsgHdr: mdns.MsgHdr{Id: q.Id, Response: true, Rcode: mdns.RcodeServerFailure}}
			out, _ = m.Pack()
		}
		return out
	}
	if err := q.Unpack(raw); err != nil {
		q = new(mdns.Msg)
		if len(raw) >= 2 {
			q.Id = uint16(raw[0])<<8 | uint16(raw[1])
		}
		return reply(mdns.RcodeFormatError, nil)
	}
	if q.Response || len(q.Question) != 1 {
		qq := q.Question
		q.Question = nil
		out := reply(mdns.RcodeFormatError, nil)
		q.Question = qq
		return out
	}
	if q.Opcode != mdns.OpcodeQuery {
		return reply(mdns.RcodeNotImplemented, nil)
	}
	qn := q.Question[0]
	name, ok := dnsName(qn.Name)
	if !ok {
		return reply(mdns.RcodeFormatError, nil)
	}
	c.DestHost = name
	if qn.Qclass != mdns.ClassINET {
		return reply(mdns.RcodeNotImplemented, nil)
	}
	switch qn.Qtype {
	case mdns.TypeTXT, mdns.TypeNULL, mdns.TypeANY, mdns.TypeAXFR, mdns.TypeIXFR:
		return reply(mdns.RcodeNotImplemented, nil)
	}
	if ee := e.sessionGate(ctx, c); ee != nil { // sessions.go
		_ = e.record(ctx, c, "dns_refused", ee.Error, false)
		e.logLine(c, ee)
		return reply(mdns.RcodeRefused, nil)
	}
	e.countName(ctx, c, name)
	if !e.allowDNS(ctx, c, name) || guard.NameClass(name) != guard.Public {
		e.dnsRefusal(ctx, c, "dns_refused", "not on the egress allowlist")
		return reply(mdns.RcodeRefused, nil)
	}
	if qn.Qtype != mdns.TypeA && qn.Qtype != mdns.TypeAAAA {
		return reply(mdns.RcodeSuccess, nil)
	}
	if e.res == nil {
		return reply(mdns.RcodeServerFailure, nil)
	}
	addrs, ttl, err := e.res.Lookup(ctx, name, qn.Qtype)
	if err != nil {
		var rc *dns.RcodeError
		if errors.As(err, &rc) && rc.Rcode == mdns.RcodeNameError {
			return reply(mdns.RcodeNameError, nil)
		}
		e.d.Log.Warn("dns: upstream failed", "request_id", rid, "dest_host", name, "err", err)
		return reply(mdns.RcodeServerFailure, nil)
	}
	rrs := make([]mdns.RR, 0, len(addrs))
	hdr := mdns.RR_Header{Name: qn.Name, Rrtype: qn.Qtype, Class: mdns.ClassINET, Ttl: min(ttl, answerTTL)}
	for _, a := range addrs {
		if err := e.dialer.Check(name, a, nil); err != nil {
			c.SetResolvedIP(a.String())
			var de *guard.DeniedError
			reason := "answer refused"
			if errors.As(err, &de) {
				reason = "answer is " + de.Class.String()
			}
			e.dnsRefusal(ctx, c, "dns_internal_answer", reason)
			return reply(mdns.RcodeRefused, nil)
		}
		if qn.Qtype == mdns.TypeA {
			rrs = append(rrs, &mdns.A{Hdr: hdr, A: a.AsSlice()})
		} else {
			rrs = append(rrs, &mdns.AAAA{Hdr: hdr, AAAA: a.AsSlice()})
		}
	}
	return reply(mdns.RcodeSuccess, rrs)
}

// dnsRefusal audits and logs a refused question.
func (e answerer) dnsRefusal(ctx context.Context, c *egressCall, event, why string) {
	c.Event = event
	ee := egressRefuse(http.StatusForbidden, refusal.EgressDenied, psDNS, why)
	_ = e.record(ctx, c, event, ee.Error, false)
	e.logLine(c, ee)
}

// dnsName canonicalises a question name: lower case, no trailing dot, at
// most 253 bytes, labels of 1-63 letters, digits, '-' or '_'.
func dnsName(fqdn string) (string, bool) {
	n := strings.ToLower(strings.TrimSuffix(fqdn, "."))
	if n == "" || len(n) > 253 {
		return "", false
	}
	for _, l := range strings.Split(n, ".") {
		if l == "" || len(l) > 63 {
			return "", false
		}
		for i := 0; i < len(l); i++ {
			switch b := l[i]; {
			case 'a' <= b && b <= 'z', '0' <= b && b <= '9', b == '-', b == '_':
			default:
				return "", false
			}
		}
	}
	return n, true
}

// baseDomain is the last two labels of name (no public-suffix list: a
// coarse grouping is enough for a signal).
func baseDomain(name string) string {
	i := strings.LastIndexByte(name, '.')
	if i < 0 {
		return name
	}
	if j := strings.LastIndexByte(name[:i], '.'); j >= 0 {
		return name[j+1:]
	}
	return name
}

// dnsAnswered writes the dns_answered record of c's question, the first
// one c's session asked of its name in the subdomain window (countName set
// c.firstAsk): answer and answerFast both call it once the answer is known,
// so a session's timeline shows every name it asked, not every repeat.
// A refused question is not one of these: dnsRefusal records it.
func (e answerer) dnsAnswered(ctx context.Context, c *egressCall, qtype uint16, rcode, answers int) {
	c.ensureRID()
	traceFrom(c, ctx) // egress_trace.go
	f := call.AppendFields(make([]audit.Field, 0, 22), &c.Record, call.EventDNSAnswered, "")
	f = append(f, audit.Field{Key: call.KeyAnswers, Value: answers},
		audit.Field{Key: call.KeyQType, Value: mdns.Type(qtype).String()},
		audit.Field{Key: call.KeyRCode, Value: mdns.RcodeToString[rcode]})
	slices.SortFunc(f, func(a, b audit.Field) int { return strings.Compare(a.Key, b.Key) })
	// Like the other DNS records, a failed write does not change the
	// answer: record counts it (sluice.audit.failures) and logs it.
	_ = e.recordFields(ctx, c, call.EventDNSAnswered, f, false)
}

// countName feeds the exfiltration signal and audits the crossing. It
// also tells (c.firstAsk) whether c's session asks name for the first time
// in the window, for dnsAnswered.
func (e answerer) countName(ctx context.Context, c *egressCall, name string) {
	base := baseDomain(name)
	n, crossed, first := e.subs.add(c.caller.Sandbox, c.caller.Session, base, name, c.Start)
	c.firstAsk = first
	if crossed {
		c.ensureRID()
		e.exfil.Add(ctx, 1, metric.WithAttributes(attribute.String("base_domain", base)))
		f := map[string]any{"sandbox": c.caller.Sandbox, "agent": c.caller.Agent, "session": c.caller.Session,
			"user": c.caller.User, "kind": "dns", "base_domain": base, "unique_names": n}
		_, _ = e.d.Append(ctx, auditRecord(c.RequestID, "dns_exfiltration_signal", signalFields(c, f)), false)
		e.d.Log.Warn("dns: many unique names under one domain", "request_id", c.RequestID, "sandbox", c.caller.Sandbox,
			"agent", c.caller.Agent, "base_domain", base, "unique_names", n)
	}
	label, _, _ := strings.Cut(name, ".")
	if h, high := highEntropyLabel(label); high {
		e.exfil.Add(ctx, 1, metric.WithAttributes(attribute.String("base_domain", base), attribute.String("signal", "label_entropy")))
		if e.subs.flagEntropy(c.caller.Sandbox, base, c.Start) {
			c.ensureRID()
			f := map[string]any{"sandbox": c.caller.Sandbox, "agent": c.caller.Agent, "session": c.caller.Session,
				"user": c.caller.User, "kind": "dns", "base_domain": base, "dest_host": name,
				"label_entropy": math.Round(h*100) / 100, "label_length": len(label)}
			_, _ = e.d.Append(ctx, auditRecord(c.RequestID, "dns_high_entropy", signalFields(c, f)), false)
			e.d.Log.Warn("dns: high-entropy label", "request_id", c.RequestID, "sandbox", c.caller.Sandbox,
				"agent", c.caller.Agent, "base_domain", base, "label_entropy", h)
		}
	}
}

// signalFields is f, a DNS signal's fields, with what the question's own
// records carry beside the caller: the egress narrowing, and the listener
// its connection came through (the connection's, never the request's).
func signalFields(c *egressCall, f map[string]any) map[string]any {
	if c.Listener != "" {
		f[call.KeyListener] = c.Listener
	}
	return withEgress(f, c.caller)
}

// ensureRID gives c a request ID if it has none yet: the fast path
// (answerFast) makes one only for a question that writes an audit record.
func (c *egressCall) ensureRID() {
	if c.RequestID == "" {
		c.RequestID = refusal.NewRequestID()
	}
}

// The label-entropy exfiltration signal: a leftmost label of at least
// entropyMinLabel bytes whose Shannon entropy is at least entropyBits bits
// per byte looks like encoded data (base32/base64 of 24+ bytes reach it
// almost always; natural names such as "release-assets-githubusercontent"
// stay near 3.6; hex-encoded data reaches it only from ~48 characters, the
// unique-names signal covers that). Every such question counts in
// sluice.dns.exfiltration_signals{signal=label_entropy}; one dns_high_entropy
// audit record is written per sandbox and base domain per
// dns.subdomain_window, so a stream of them cannot flood the audit log.
const (
	entropyMinLabel = 20
	entropyBits     = 3.8
)

// highEntropyLabel returns label's entropy and whether it crosses the signal.
func highEntropyLabel(label string) (float64, bool) {
	if len(label) < entropyMinLabel {
		return 0, false
	}
	h := findings.Shannon(label)
	return h, h >= entropyBits
}

// subdomains counts, per sandbox and base domain, the distinct names asked
// within a window. Memory is bounded: a set stops growing at the threshold.
type subdomains struct {
	threshold int
	window    time.Duration
	mu        sync.Mutex
	m         map[[2]string]*nameSet

	state *dnsState // the answerer's caches (dns_decisions.go)
}

type nameSet struct {
	since time.Time
	// names maps each distinct name asked to the first session that asked
	// it; others holds the further sessions that asked the same name.
	names    map[string]string
	others   map[[2]string]struct{}
	signaled bool
	entropy  bool // a dns_high_entropy record was written in this window
}

// flagEntropy reports whether this is the first high-entropy question of
// the (sandbox, base domain) pair's current window; add has made the set.
func (s *subdomains) flagEntropy(sandbox, base string, now time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	ns := s.m[[2]string{sandbox, base}]
	if ns == nil || now.Sub(ns.since) > s.window || ns.entropy {
		return false
	}
	ns.entropy = true
	return true
}

func newSubdomains(threshold int, window time.Duration) *subdomains {
	return &subdomains{threshold: threshold, window: window, m: map[[2]string]*nameSet{}, state: newDNSState()}
}

// maxSubdomainKeys bounds the (sandbox, base domain) pairs tracked.
const maxSubdomainKeys = 1 << 16

// add records name and reports the count, whether this call crossed the
// threshold (once per window), and whether session asks name for the
// first time in the window. Past the threshold (or past maxSubdomainKeys
// pairs) new names are not tracked and report first false: the
// dns_exfiltration_signal record stands for them.
func (s *subdomains) add(sandbox, session, base, name string, now time.Time) (n int, crossed, first bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]string{sandbox, base}
	ns := s.m[k]
	if ns == nil || now.Sub(ns.since) > s.window {
		if ns == nil && len(s.m) >= maxSubdomainKeys {
			for ok, v := range s.m {
				if now.Sub(v.since) > s.window {
					delete(s.m, ok)
				}
			}
			if len(s.m) >= maxSubdomainKeys {
				return 0, false, false
			}
		}
		ns = &nameSet{since: now, names: map[string]string{}}
		s.m[k] = ns
	}
	// A name seen before by the same session is only looked up: no map
	// write (the common question repeats a name), the same set either way.
	switch by, seen := ns.names[name]; {
	case !seen:
		if len(ns.names) <= s.threshold {
			ns.names[name] = session
			first = true
		}
	case by != session:
		ok := [2]string{session, name}
		if _, asked := ns.others[ok]; !asked && len(ns.others) <= s.threshold {
			if ns.others == nil {
				ns.others = map[[2]string]struct{}{}
			}
			ns.others[ok] = struct{}{}
			first = true
		}
	}
	n = len(ns.names)
	if n > s.threshold && !ns.signaled {
		ns.signaled = true
		return n, true, first
	}
	return n, false, first
}

func auditRecord(rid, event string, f map[string]any) audit.Record {
	return audit.Record{RequestID: rid, Event: event, Fields: f}
}

// allowDNS decides host for c like decide (proxy.go) with kind "dns", at
// c.Start, through the decision cache: on a miss the same input document (the caller and
// the name) goes to policy. c carries the decision for the audit record
// of a refusal either way.
func (e answerer) allowDNS(ctx context.Context, c *egressCall, host string) bool {
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
