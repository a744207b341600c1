# A policy as a team runs it under opa-envoy-plugin (decision path
# envoy/authz/allow, input in the plugin's shape). sluice loads this file
# unchanged; adapter.rego is the only addition.
package envoy.authz

import input.attributes.request.http as http_request

default allow := false

# The pet list, at most 50 at a time.
allow if {
	http_request.method == "GET"
	input.parsed_path == ["v2", "pets"]
	to_number(object.get(input.parsed_query, "limit", ["20"])[0]) <= 50
}

# One pet.
allow if {
	http_request.method == "GET"
	input.parsed_path[0] == "v2"
	input.parsed_path[1] == "pets"
	count(input.parsed_path) == 3
}

# Adding a pet, from the mesh's agents only, never with a reserved tag.
allow if {
	http_request.method == "POST"
	input.parsed_path == ["v2", "pets"]
	startswith(input.attributes.source.principal, "spiffe://cluster.local/ns/agents/")
	not input.parsed_body.tag in {"admin", "staff"}
}
