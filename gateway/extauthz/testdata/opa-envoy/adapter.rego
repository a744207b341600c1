# Runs an opa-envoy-plugin policy (data.envoy.authz.allow) on input.envoy,
# the request in that plugin's input shape, as one of sluice's modules.
package sluice.policies.envoy

import data.envoy.authz

decisions contains {"action": "allow", "rule": "envoy.authz", "reason": "allowed by envoy.authz"} if {
	input.envoy
	authz.allow with input as input.envoy
}

decisions contains {"action": "block", "rule": "envoy.authz", "reason": "denied by envoy.authz"} if {
	input.envoy
	not authz.allow with input as input.envoy
}
