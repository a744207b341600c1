package extauthz

import (
	"encoding/json"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/sluice-gw/sluice/gateway/audit"
)

// EnvoyJSON is input.envoy as the gateway hands it to policy and records
// it: EnvoyInput's document encoded exactly as json.Marshal encodes it
// (keys sorted, compact, HTML-escaped), without reflection. The decision
// parses these bytes once (policy.ParseJSON) and the recorded input
// carries them as they are, where a map was converted to policy's value
// and encoded again per Check. TestEnvoyJSONMatchesMarshal holds the two
// encodings to the same bytes.
func EnvoyJSON(cr *authv3.CheckRequest, r *Request) (json.RawMessage, error) {
	in, err := EnvoyInput(cr, r)
	if err != nil {
		return nil, err
	}
	return audit.AppendJSONValue(make([]byte, 0, 1024), in)
}
