package toolinput

import (
	"encoding/json"
	"strconv"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/policy"
)

// AppendJSON appends in exactly as json.Marshal(in) encodes it, without
// reflection over the arguments' and the request's maps, which was most of
// the recorded input's cost (a map's keys are sorted through reflect, a
// value boxed per entry). It encodes a tool call's usual input itself: ok
// is false for anything else (an Envoy document, findings, arguments
// json.Marshal refuses), which the caller encodes with encoding/json. TestAppendJSONIsMarshal and FuzzAppendJSON hold the
// bytes to json.Marshal's; TestAppendJSONKnowsEveryField fails when
// policy.Input gains a field this does not write.
func AppendJSON(dst []byte, in *policy.Input) (_ []byte, ok bool) {
	if len(in.Envoy) > 0 || len(in.Findings) > 0 {
		return dst, false
	}
	tm, err := in.Time.MarshalJSON()
	if err != nil {
		return dst, false
	}
	dst = append(dst, `{"version":`...)
	dst = strconv.AppendInt(dst, int64(in.Version), 10)
	dst = appendKeyString(dst, `,"kind":`, in.Kind)
	c := &in.Caller
	dst = appendKeyString(dst, `,"caller":{"sandbox":`, c.Sandbox)
	dst = appendKeyString(dst, `,"agent":`, c.Agent)
	dst = appendKeyString(dst, `,"session":`, c.Session)
	dst = appendKeyString(dst, `,"user":`, c.User)
	dst = appendKeyString(dst, `},"connector":`, in.Connector)
	dst = appendKeyString(dst, `,"tool":`, in.Tool)
	o := &in.Operation
	dst = appendKeyString(dst, `,"operation":{"id":`, o.ID)
	dst = appendKeyString(dst, `,"method":`, o.Method)
	dst = appendKeyString(dst, `,"path":`, o.Path)
	dst = appendKeyString(dst, `,"risk":`, o.Risk)
	dst = append(dst, `,"tags":`...)
	dst = audit.AppendJSONStrings(dst, o.Tags)
	dst = append(dst, `},"args":`...)
	if dst, err = audit.AppendJSONValue(dst, in.Args); err != nil {
		return dst, false
	}
	r := &in.Request
	dst = appendKeyString(dst, `,"request":{"method":`, r.Method)
	dst = appendKeyString(dst, `,"host":`, r.Host)
	if r.Port != 0 {
		dst = append(dst, `,"port":`...)
		dst = strconv.AppendInt(dst, int64(r.Port), 10)
	}
	dst = appendKeyString(dst, `,"path":`, r.Path)
	dst = append(dst, `,"query":`...)
	dst = audit.AppendJSONStringLists(dst, r.Query)
	dst = append(dst, `,"headers":`...)
	dst = audit.AppendJSONStringLists(dst, r.Headers)
	if r.Body != "" {
		dst = appendKeyString(dst, `,"body":`, r.Body)
	}
	dst = append(dst, `},"time":`...)
	dst = append(dst, tm...)
	dst = append(dst, `,"findings":`...)
	if in.Findings == nil {
		dst = append(dst, "null"...)
	} else {
		dst = append(dst, "[]"...)
	}
	if in.Usage != nil {
		u, err := json.Marshal(in.Usage) // numbers only: no map, little reflection
		if err != nil {
			return dst, false
		}
		dst = append(append(dst, `,"usage":`...), u...)
	}
	return append(dst, '}'), true
}

func appendKeyString(dst []byte, key, s string) []byte {
	return audit.AppendJSONString(append(dst, key...), s)
}
