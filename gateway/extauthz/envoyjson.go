package extauthz

import (
	"encoding/json"
	"slices"

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
	return appendJSON(make([]byte, 0, 1024), in)
}

// appendJSON appends v, of the types EnvoyInput builds (the types
// encoding/json decodes into, with UseNumber), as json.Marshal would;
// anything else is handed to json.Marshal.
func appendJSON(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		if v {
			return append(dst, "true"...), nil
		}
		return append(dst, "false"...), nil
	case string:
		return audit.AppendJSONString(dst, v), nil
	case []any:
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = appendJSON(dst, e); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case map[string]any:
		var kb [16]string // the maps here are small: sorted without allocating
		keys := kb[:0]
		for k := range v {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = append(dst, '{')
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = audit.AppendJSONString(dst, k)
			dst = append(dst, ':')
			var err error
			if dst, err = appendJSON(dst, v[k]); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	}
	b, err := json.Marshal(v) // json.Number (validated), and anything unforeseen
	if err != nil {
		return nil, err
	}
	return append(dst, b...), nil
}
