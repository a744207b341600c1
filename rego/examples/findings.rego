# An example for security teams (not part of the shipped library: copy it into
# a directory listed under `rego:`). It blocks any call or proxied request that
# would send something credential-shaped — whatever host it goes to, allowed
# ones included. The gateway attaches the real credentials itself, after the
# decision, so a credential in what the agent sends is one it should not have.
#
# input.findings is filled by the gateway before every decision (kind,
# location as a JSON pointer into the input, a fingerprint; never the value).
# high_entropy findings are left to you: random-looking strings are also
# request IDs and hashes.
package sluice.policies.findings

credential_kinds := {
	"aws_access_key_id", "aws_secret_access_key", "gcp_api_key", "gcp_service_account_key",
	"azure_storage_key", "private_key", "github_token", "slack_token", "slack_webhook",
	"stripe_key", "jwt",
}

decisions contains {
	"action": "block",
	"reason": sprintf("a credential (%s) would be sent at %s", [f.kind, f.location]),
	"rule": "findings.credential",
} if {
	some f in input.findings
	f.kind in credential_kinds
}

# What the scanner could not see (past its size bound) is refused too.
decisions contains {
	"action": "block",
	"reason": sprintf("not scanned for credentials: %s", [f.reason]),
	"rule": "findings.unscanned",
} if {
	some f in input.findings
	f.kind == "unscanned"
}
