package audit

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Brief is one record reduced to what a table or a session's timeline
// shows: what kind of thing happened, to what, decided how, with what
// result. It reads only names, statuses and codes the gateway wrote (the
// log holds no secrets; see the caller contract).
type Brief struct {
	// Kind is "tool call", "proxied request", "tunnel", "DNS question",
	// "hold", "grant", "session", "sandbox", "review UI", "audit log", or
	// the event itself for anything else.
	Kind                                 string
	Tool, User, Agent, Session, Sandbox  string
	Decision, Hold, Rule, Reason, Detail string
	// What is the tool, "host:port" of a request or tunnel, or the DNS name.
	What string
	// Result is "status 200 · upstream 201", "refused egress_denied", … ("" when none).
	Result string
}

// Field returns a record's field as text ("" when absent; numbers as written).
func (r Record) Field(key string) string {
	switch v := r.Fields[key].(type) {
	case nil:
		return ""
	case string:
		return v
	case json.Number:
		return v.String()
	case bool, float64, int, int64, uint64:
		return fmt.Sprint(v)
	default:
		b, err := json.Marshal(v)
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}

// Briefly reduces r to a Brief.
func Briefly(r Record) Brief {
	b := Brief{Tool: r.Field("tool"), User: r.Field("user"), Agent: r.Field("agent"), Session: r.Field("session"),
		Sandbox: r.Field("sandbox"), Decision: r.Field("decision"), Hold: r.Field("hold"), Rule: r.Field("rule"),
		Reason: r.Field("reason")}
	host := r.Field("dest_host")
	if p := r.Field("port"); p != "" && host != "" {
		host += ":" + p
	}
	ev := r.Event
	switch kind := r.Field("kind"); {
	case kind == "http":
		b.Kind, b.What = "proxied request", host
	case kind == "connect":
		b.Kind, b.What = "tunnel", host
	case kind == "dns":
		b.Kind, b.What = "DNS question", r.Field("dest_host")
	case strings.HasPrefix(ev, "hold_"):
		b.Kind, b.What = "hold", b.Tool
		if d := strings.TrimPrefix(ev, "hold_"); b.Decision == "" && (d == "approved" || d == "denied" || d == "expired") {
			b.Decision = d
		}
	case strings.HasPrefix(ev, "grant_"):
		b.Kind, b.What = "grant", b.Tool
	case strings.HasPrefix(ev, "session_"):
		b.Kind = "session"
	case strings.HasPrefix(ev, "sandbox_"):
		b.Kind, b.What = "sandbox", r.Field("host")
	case strings.HasPrefix(ev, "ui."):
		b.Kind = "review UI"
	case strings.HasPrefix(ev, "audit_"):
		b.Kind = "audit log"
	case b.Tool != "":
		b.Kind, b.What = "tool call", b.Tool
	default:
		b.Kind = ev
	}
	var res []string
	if s := r.Field("status"); s != "" {
		res = append(res, "status "+s)
	}
	if s := r.Field("upstream_status"); s != "" {
		res = append(res, "upstream "+s)
	}
	if s := r.Field("code"); s != "" {
		res = append(res, "refused "+s)
	}
	if s := r.Field("upstream_error"); s != "" {
		res = append(res, "upstream error "+s)
	}
	if s := r.Field("rcode"); s != "" { // dns_answered
		res = append(res, r.Field("qtype")+" "+s+" · "+r.Field("answers")+" answers")
	}
	b.Result = strings.Join(res, " · ")
	var det []string
	for _, k := range []string{"by", "decision_reason", "outcome", "approvers", "resolved_ip", "credential", "expires", "grant", "base_domain"} {
		if s := r.Field(k); s != "" {
			det = append(det, k+" "+s)
		}
	}
	b.Detail = strings.Join(det, " · ")
	return b
}
