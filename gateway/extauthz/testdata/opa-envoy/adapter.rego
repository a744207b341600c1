# Runs an opa-envoy-plugin policy (data.envoy.authz.allow) on input.envoy,
# the request in that plugin's input shape, as one of sluice's modules.
package sluice.policies.envoy

import data.envoy.authz

# The team's policy, evaluated once per request.
allowed if authz.allow with input as input.envoy

decisions contains {"action": "allow", "rule": "envoy.authz", "reason": "allowed by envoy.authz"} if {
	input.envoy
	allowed
}

decisions contains {"action": "block", "rule": "envoy.authz", "reason": "denied by envoy.authz"} if {
	input.envoy
	not allowed
}
