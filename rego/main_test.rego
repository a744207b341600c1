# Tests for the decision library. They supply the compiled simple rules with
# `with data.sluice.config.rules as ...` (the shape the Go side writes) and the
# modules with `with data.sluice.policies as ...`, so they are hermetic: they
# pass under `opa test rego/`, from `go test ./policy` and from
# `sluice policy test` next to a deployment's own rules and modules.
package sluice.main_test

import data.sluice.main

rule(i, match, action, prefix) := {
	"rule": sprintf("policies[%d]", [i]),
	"action": action,
	"reason": sprintf("reason %d", [i]),
	"approvers": [],
	"obligations": {},
	"key": [1, i, sprintf("policies[%d]", [i]), sprintf("reason %d", [i])],
	"match": match,
	"prefix": prefix,
}

ask_rule(i, match, approvers) := object.union(rule(i, match, "ask", ""), {"approvers": approvers})

# policies:
#   [0] billing.get_*            allow  (prefix rule, grouped by slug)
#   [1] billing.create_refund    ask    [group:finance]
#   [2] billing.create_refund    ask    [alice, group:finance]
#   [3] billing.*_admin          block  (glob, grouped by slug)
#   [4] *.delete_*               block  (glob without a slug: scanned)
#   [5] ops.get_status           allow
#   [6] ops.get_status           allow  (duplicate, loses the tie)
rules := {
	"exact": {
		"billing.create_refund": [
			ask_rule(1, "billing.create_refund", ["group:finance"]),
			ask_rule(2, "billing.create_refund", ["alice", "group:finance"]),
		],
		"ops.get_status": [rule(5, "ops.get_status", "allow", ""), rule(6, "ops.get_status", "allow", "")],
	},
	"by_slug": {"billing": [
		rule(0, "billing.get_*", "allow", "billing.get_"),
		rule(3, "billing.*_admin", "block", ""),
	]},
	"scan": [rule(4, "*.delete_*", "block", "")],
	"any": [],
}

call(tool) := {"version": 1, "kind": "tool_call", "tool": tool}

test_prefix_rule_allows if {
	d := main.decision with input as call("billing.get_invoice") with data.sluice.config.rules as rules with data.sluice.policies as {}
	d.action == "allow"
	d.rule == "policies[0]"
	d.approvers == []
}

test_glob_star_matches_dots if {
	d := main.decision with input as call("billing.get_x.y_admin") with data.sluice.config.rules as rules with data.sluice.policies as {}
	d.action == "block"
	d.rule == "policies[3]"
}

test_scanned_glob_blocks if {
	d := main.decision with input as call("crm.delete_contact") with data.sluice.config.rules as rules with data.sluice.policies as {}
	d.action == "block"
	d.rule == "policies[4]"
}

test_no_rule_blocks if {
	d := main.decision with input as call("crm.get_contact") with data.sluice.config.rules as rules with data.sluice.policies as {}
	d == main.default_decision
	d.action == "block"
	d.rule == "default"
}

test_no_rules_at_all_blocks if {
	d := main.decision with input as call("billing.get_invoice")
		with data.sluice.config.rules as {}
		with data.sluice.policies as {}
	d.rule == "default"
	d.action == "block"
}

test_ask_approvers_are_the_union if {
	d := main.decision with input as call("billing.create_refund") with data.sluice.config.rules as rules with data.sluice.policies as {}
	d.action == "ask"
	d.rule == "policies[1]"
	d.approvers == ["alice", "group:finance"]
}

test_tie_goes_to_the_first_rule if {
	d := main.decision with input as call("ops.get_status") with data.sluice.config.rules as rules with data.sluice.policies as {}
	d.rule == "policies[5]"
}

test_catch_all_decides_when_nothing_else_matches if {
	r := object.union(rules, {"any": [rule(7, "*", "ask", "")]})
	d := main.decision with input as call("crm.get_contact") with data.sluice.config.rules as r with data.sluice.policies as {}
	d.action == "ask"
	d.rule == "policies[7]"

	# a specific block still blocks
	b := main.decision with input as call("crm.delete_contact") with data.sluice.config.rules as r with data.sluice.policies as {}
	b.rule == "policies[4]"
}

test_catch_all_block_does_not_override_specific_allow if {
	r := object.union(rules, {"any": [rule(7, "*", "block", "")]})
	d := main.decision with input as call("billing.get_invoice") with data.sluice.config.rules as r with data.sluice.policies as {}
	d.action == "allow"
	d.rule == "policies[0]"
}

test_catch_all_allow_does_not_override_specific_ask if {
	r := object.union(rules, {"any": [rule(7, "*", "allow", "")]})
	d := main.decision with input as call("billing.create_refund") with data.sluice.config.rules as r with data.sluice.policies as {}
	d.action == "ask"
}

test_module_decision_replaces_catch_all if {
	r := object.union(rules, {"any": [rule(7, "*", "block", "")]})
	mods := {"team": {"decisions": {{"action": "allow", "reason": "ok", "rule": "team.ok"}}}}
	d := main.decision with input as call("crm.get_contact")
		with data.sluice.config.rules as r
		with data.sluice.policies as mods
	d.rule == "team.ok"
}

test_simple_rules_ignore_raw_egress if {
	r := object.union(rules, {"any": [rule(7, "*", "allow", "")]})
	d := main.decision with input as {"version": 1, "kind": "http", "tool": ""} with data.sluice.config.rules as r with data.sluice.policies as {}
	d.rule == "default"
	d.action == "block"
}

test_module_block_beats_simple_allow if {
	mods := {"team": {"decisions": {{"action": "block", "reason": "invoices are frozen", "rule": "team.freeze"}}}}
	d := main.decision with input as call("billing.get_invoice")
		with data.sluice.config.rules as rules
		with data.sluice.policies as mods
	d.action == "block"
	d.rule == "team.freeze"
	d.reason == "invoices are frozen"
}

test_module_allow_without_simple_rules if {
	mods := {"egress": {"decisions": {{"action": "allow", "reason": "pypi"}}}}
	d := main.decision with input as {"version": 1, "kind": "connect"}
		with data.sluice.config.rules as {}
		with data.sluice.policies as mods
	d.action == "allow"
	d.rule == "sluice.policies.egress"
}

test_module_invalid_action_blocks if {
	mods := {"team": {"decisions": {{"action": "deny", "rule": "team.typo"}}}}
	d := main.decision with input as call("billing.get_invoice")
		with data.sluice.config.rules as rules
		with data.sluice.policies as mods
	d.action == "block"
	d.rule == "team.typo"
	contains(d.reason, "invalid action")
}

test_module_ask_adds_approvers if {
	mods := {"team": {"decisions": {{"action": "ask", "rule": "team.review", "approvers": ["bob"]}}}}
	d := main.decision with input as call("billing.create_refund")
		with data.sluice.config.rules as rules
		with data.sluice.policies as mods
	d.action == "ask"
	d.rule == "team.review" # modules come first among equals
	d.approvers == ["alice", "bob", "group:finance"]
}

# Raw egress: data.sluice.config.egress as the Go side writes it for
#   agents: [{name: builder, egress: [pypi.org, "*.pythonhosted.org"]}]
#   egress: {connect_ports: [8443]}
egress := {
	"agents": {"builder": {"exact": {"pypi.org": true}, "suffixes": [".pythonhosted.org"]}},
	"ports": {"http": [80, 443], "connect": [443, 8443]},
}

raw(kind, agent, host, port) := {
	"version": 1, "kind": kind, "caller": {"agent": agent},
	"request": {"host": host, "port": port},
}

egress_decision(x) := d if {
	d := main.decision with input as x
		with data.sluice.config.rules as {"exact": {}, "by_slug": {}, "scan": [], "any": []}
		with data.sluice.config.egress as egress
		with data.sluice.policies as {}
}

test_egress_exact_host_allowed if {
	d := egress_decision(raw("connect", "builder", "pypi.org", 443))
	d.action == "allow"
	d.rule == "egress"
}

test_egress_suffix_allows_any_depth if {
	egress_decision(raw("connect", "builder", "files.pythonhosted.org", 443)).action == "allow"
	egress_decision(raw("http", "builder", "a.b.pythonhosted.org", 80)).action == "allow"
}

test_egress_suffix_does_not_allow_the_domain_itself if {
	egress_decision(raw("connect", "builder", "pythonhosted.org", 443)).action == "block"
}

test_egress_lookalike_blocked if {
	egress_decision(raw("connect", "builder", "evilpythonhosted.org", 443)).action == "block"
	egress_decision(raw("connect", "builder", "pypi.org.evil.example", 443)).action == "block"
}

test_egress_other_agent_blocked if {
	d := egress_decision(raw("connect", "other", "pypi.org", 443))
	d.action == "block"
	d.rule == "default"
}

test_egress_ports if {
	egress_decision(raw("connect", "builder", "pypi.org", 8443)).action == "allow"
	egress_decision(raw("connect", "builder", "pypi.org", 22)).action == "block"
	egress_decision(raw("http", "builder", "pypi.org", 8443)).action == "block"
	egress_decision(raw("http", "builder", "pypi.org", 80)).action == "allow"
}

test_egress_dns_needs_no_port if {
	egress_decision({"version": 1, "kind": "dns", "caller": {"agent": "builder"}, "request": {"host": "files.pythonhosted.org"}}).action == "allow"
}

test_egress_never_for_tool_calls if {
	d := egress_decision({"version": 1, "kind": "tool_call", "tool": "pypi.org", "caller": {"agent": "builder"}, "request": {"host": "pypi.org", "port": 443}})
	d.action == "block"
}

test_egress_module_block_wins if {
	d := main.decision with input as raw("connect", "builder", "pypi.org", 443)
		with data.sluice.config.rules as {"exact": {}, "by_slug": {}, "scan": [], "any": []}
		with data.sluice.config.egress as egress
		with data.sluice.policies as {"x": {"decisions": {{"action": "block", "rule": "x.no", "reason": "no"}}}}
	d.action == "block"
	d.rule == "x.no"
}
