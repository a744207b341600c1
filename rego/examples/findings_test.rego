package sluice.policies.findings_test

import data.sluice.policies.findings

test_credential_in_arguments_blocks if {
	some d in findings.decisions with input as {
		"kind": "tool_call",
		"findings": [{"kind": "aws_access_key_id", "location": "/args/body/note", "fingerprint": "sha256:0123456789ab"}],
	}
	d.action == "block"
	d.rule == "findings.credential"
	contains(d.reason, "/args/body/note")
}

test_credential_in_a_header_to_an_allowed_host_blocks if {
	some d in findings.decisions with input as {
		"kind": "http",
		"request": {"host": "pypi.org"},
		"findings": [{"kind": "github_token", "location": "/request/headers/Authorization", "fingerprint": "sha256:0123456789ab"}],
	}
	d.rule == "findings.credential"
}

test_high_entropy_alone_is_left_alone if {
	count(findings.decisions) == 0 with input as {"kind": "tool_call", "findings": [{"kind": "high_entropy", "location": "/args/body/id"}]}
}

test_unscanned_blocks if {
	some d in findings.decisions with input as {"kind": "tool_call", "findings": [{"kind": "unscanned", "location": "/args/body/blob", "reason": "over the bound"}]}
	d.rule == "findings.unscanned"
}

test_nothing_found_nothing_decided if {
	count(findings.decisions) == 0 with input as {"kind": "tool_call", "findings": []}
}
