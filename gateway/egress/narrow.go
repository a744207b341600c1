package egress

import (
	"github.com/sluice-gw/sluice/policy"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// A sandbox's egress narrowing (sandboxd create/run --egress) arrives in
// its identity (wire.Identity.Egress) and rides in policy.Caller wherever
// the caller goes. It only ever removes hosts: the gateway allows raw
// egress (http, connect, dns) to a host when policy allows it for the
// agent AND the narrowing lists it. The narrowing gate runs before policy
// in decide and allowDNS, the decision points of every proxied request,
// CONNECT, in-tunnel request and DNS question, so no module's allow can
// reach past it. Whether a narrowing is inside the agent's allowlist is
// checked when sandboxd asks for the tools at create (GET /v1/tools
// answers 403 egress_not_granted); at run time the intersection holds
// whatever the list says, also after a reload shrinks the agent's list.

// narrowRule is the rule name of a refusal by the narrowing.
const narrowRule = "sandbox_egress"

// NarrowDecision is the decision of a host a sandbox's narrowing leaves out.
var NarrowDecision = policy.Decision{Action: policy.Block, Rule: narrowRule,
	Reason: "host is not on the sandbox's egress list (sandboxd --egress)"}

// CallerOf is the policy caller of a relayed identity, narrowing included.
func CallerOf(id wire.Identity) policy.Caller {
	return policy.Caller{Sandbox: id.Sandbox, Agent: id.Agent, Session: id.Session, User: id.User, Egress: id.Egress}
}

// NarrowedOut reports whether c's narrowing leaves host out. A narrowing
// that does not parse (wire.Read checked it on arrival, so a bug) leaves
// every host out: fail closed.
func NarrowedOut(c policy.Caller, host string) bool {
	if c.Egress == "" {
		return false
	}
	hosts, err := wire.ParseEgress(c.Egress)
	if err != nil {
		return true
	}
	return !wire.EgressAllows(hosts, host)
}

// withEgress adds c's narrowing to audit fields f, when it has one.
func withEgress(f map[string]any, c policy.Caller) map[string]any {
	if c.Egress != "" {
		f["egress"] = c.Egress
	}
	return f
}
