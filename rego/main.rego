# sluice's decision library. data.sluice.main.decision is the decision for one
# tool call, proxied request, CONNECT or DNS question. See README.md.
#
# Candidates come from two sources:
#   - the simple rules of sluice.yaml, compiled by the Go side into
#     data.sluice.config.rules (exact names, wildcards grouped by connector
#     slug, other wildcards, catch-alls), so a call runs only a few globs;
#   - every package sluice.policies.<name> that defines a set `decisions`.
# The most restrictive candidate wins (block > ask > allow). Catch-all rules
# (match "*") count only when nothing else matched; no candidate is a block.
# Every failure to produce a well-formed decision is a block too: the Go side
# turns errors and odd shapes into Block with rule "policy_error".
#
# The gateway evaluates only data.sluice.main.module_candidates; it matches
# the simple rules and combines the candidates in Go exactly as `decision`
# below does (a differential test in policy/ keeps the two identical). Those
# are the parts that cost the most in Rego and the least in Go.
package sluice.main

# rank orders actions from least to most restrictive.
rank := {"allow": 1, "ask": 2, "block": 3}

default_decision := {
	"action": "block",
	"reason": "no rule matched",
	"rule": "default",
	"approvers": [],
	"obligations": {},
}

# specific holds the candidates other than the catch-alls: the compiled simple
# rules that match input.tool and the modules' decisions. Simple rules apply to
# tool calls only; raw egress (http, connect, dns) is decided by modules, so a
# catch-all `*: allow` never opens raw egress by accident. A compiled simple
# rule is already a candidate: action, reason, rule, approvers, obligations
# and key (ties go to modules first, source 0, then to simple rules in config
# order: [1, index, rule, reason]).
specific contains r if {
	input.kind == "tool_call"
	some r in data.sluice.config.rules.exact[input.tool]
}

# Wildcards: a literal prefix followed by one trailing `*` is checked with
# startswith, other globs with glob.match, where `*` matches any characters,
# dots included (null delimiters). wildcard_match says the same; it is
# spelled out here because a function call per rule costs more than the match.
specific contains r if {
	input.kind == "tool_call"
	some r in data.sluice.config.rules.by_slug[tool_slug]
	r.prefix != ""
	startswith(input.tool, r.prefix)
}

specific contains r if {
	input.kind == "tool_call"
	some r in data.sluice.config.rules.by_slug[tool_slug]
	r.prefix == ""
	glob.match(r.match, null, input.tool)
}

specific contains r if {
	input.kind == "tool_call"
	some r in data.sluice.config.rules.scan
	r.prefix != ""
	startswith(input.tool, r.prefix)
}

specific contains r if {
	input.kind == "tool_call"
	some r in data.sluice.config.rules.scan
	r.prefix == ""
	glob.match(r.match, null, input.tool)
}

specific contains c if {
	some c in module_candidates
}

# policy_candidates are the decisions of the sluice.policies.* modules, as
# candidates. For tool calls they are all of module_candidates (the egress
# allowlists below decide raw egress only), so the gateway evaluates just
# this rule for a tool call.
policy_candidates contains c if {
	some name
	some d in data.sluice.policies[name].decisions
	c := module_candidate(name, d)
}

# module_candidates are every candidate that does not come from a simple
# rule: the modules' decisions and the egress allowlists'.
module_candidates contains c if {
	some c in policy_candidates
}

# egress_candidates allow raw egress (http, connect, dns) to a host on the
# caller's agent allowlist (sluice.yaml agents[].egress, compiled by the Go
# side into data.sluice.config.egress): an exact name, or a "*.domain"
# pattern, kept as the suffix ".domain" (any name below the domain, not the
# domain itself). http and connect must also name an allowed port
# (data.sluice.config.egress.ports: 80 and 443 for http; 443 and
# egress.connect_ports for connect). They are module candidates, so the
# engine's Go combining sees them exactly as `decision` does; a module's
# block still wins over them.
egress_reason := "host on the agent's egress allowlist"

egress_candidates contains c if {
	input.kind in {"http", "connect", "dns"}
	allow := data.sluice.config.egress.agents[input.caller.agent]
	egress_listed(allow, input.request.host)
	egress_port_ok
	c := {
		"action": "allow",
		"reason": egress_reason,
		"rule": "egress",
		"approvers": [],
		"obligations": {},
		"key": [0, 0, "egress", egress_reason],
	}
}

egress_listed(allow, host) if allow.exact[host] == true

egress_listed(allow, host) if {
	some s in allow.suffixes
	endswith(host, s)
}

egress_port_ok if input.kind == "dns"

egress_port_ok if {
	input.kind in {"http", "connect"}
	input.request.port in data.sluice.config.egress.ports[input.kind]
}

module_candidates contains c if {
	some c in egress_candidates
}

# tool_slug is the connector slug: the part of the tool name before the first dot.
tool_slug := substring(input.tool, 0, i) if {
	i := indexof(input.tool, ".")
	i > 0
}

# A wildcard rule is either a literal prefix followed by one trailing `*`
# (checked with startswith) or a general glob in which `*` matches any
# characters, dots included (null delimiters).
wildcard_match(r) if {
	r.prefix != ""
	startswith(input.tool, r.prefix)
}

wildcard_match(r) if {
	r.prefix == ""
	glob.match(r.match, null, input.tool)
}

# field returns d[k], or def when d has no such field (or is not an object).
field(d, k, def) := v if {
	v := d[k]
} else := def

# candidates are the specific decisions when there is any; otherwise the
# catch-all rules (match "*"), which act as the default: `*: block` at the end
# of the list does not override `billing-api.get_*: allow`.
candidates := specific if {
	count(specific) > 0
} else := fallback

# fallback holds the catch-all rules (match "*"), for tool calls only.
fallback contains r if {
	input.kind == "tool_call"
	some r in data.sluice.config.rules.any
}

module_candidate(name, d) := c if {
	rank[d.action]
	rule := field(d, "rule", concat(".", ["sluice.policies", name]))
	reason := field(d, "reason", "")
	c := {
		"action": d.action,
		"reason": reason,
		"rule": rule,
		"approvers": field(d, "approvers", []),
		"obligations": field(d, "obligations", {}),
		"key": [0, 0, rule, reason],
	}
}

# A decision with a missing or unknown action ("deny", "Allow", 1) blocks:
# a typo must never let a less restrictive rule win.
module_candidate(name, d) := c if {
	not rank[d.action]
	rule := field(d, "rule", concat(".", ["sluice.policies", name]))
	c := {
		"action": "block",
		"reason": sprintf("invalid action %v in a decision of sluice.policies.%s", [field(d, "action", null), name]),
		"rule": rule,
		"approvers": [],
		"obligations": {},
		"key": [0, 0, rule, ""],
	}
}

top := max({rank[c.action] | some c in candidates})

winner := min({[c.key, c] | some c in candidates; rank[c.action] == top})[1]

# The approvers of an ask are the union of the approvers of every matching ask.
approvers := sort({a | some c in candidates; c.action == "ask"; some a in c.approvers}) if {
	top == rank.ask
} else := []

decision := d if {
	count(candidates) > 0
	d := {
		"action": winner.action,
		"reason": winner.reason,
		"rule": winner.rule,
		"approvers": approvers,
		"obligations": winner.obligations,
	}
} else := default_decision
