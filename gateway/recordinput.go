package gateway

import (
	"encoding/json"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/toolinput"
	"github.com/sluice-gw/sluice/policy"
)

// recordInput puts the decision's input document on the call's record, so
// that its decision record carries it (audit.record_inputs) and `sluice
// policy replay` can decide it again. The input is the one the decision
// saw: built before any credential is attached, so no credential can be
// in it. An input larger than audit.record_input_max loses its bodies
// (args.body, request.body); one still too large is not recorded, and the
// record says what was cut and the size before the cut.
func (c *toolCall) recordInput(a config.Audit, in *policy.Input) {
	if !a.InputsRecorded() || in == nil {
		return
	}
	c.rec.Input, c.rec.InputCut, c.rec.InputSize = encodeInput(in, a.RecordInputMax)
}

// encodeInput is recordInput's encoding of in within max bytes (0 is
// config.DefaultRecordInputMax): the JSON, and when it had to be cut, what
// was cut and the size before.
func encodeInput(in *policy.Input, max int) (call.EncodedJSON, string, int) {
	if max <= 0 {
		max = config.DefaultRecordInputMax
	}
	b, ok := toolinput.AppendJSON(make([]byte, 0, 1024), in) // json.Marshal's bytes, without reflection
	var err error
	if !ok {
		b, err = json.Marshal(in)
	}
	if err != nil {
		// Not JSON-encodable (cannot happen for a decoded tool call):
		// recorded as cut whole rather than failing the call.
		return nil, "input", 0
	}
	if len(b) <= max {
		return b, "", 0
	}
	size := len(b)
	cut := *in
	cut.Request.Body = ""
	if a, ok := in.Args.(map[string]any); ok {
		na := make(map[string]any, len(a))
		for k, v := range a {
			na[k] = v
		}
		na["body"] = nil
		cut.Args = na
	}
	if b, err = json.Marshal(&cut); err == nil && len(b) <= max {
		return b, "args.body,request.body", size
	}
	return nil, "input", size
}

// inputFields are the recorded-input fields of c's decision record as a
// map, for the hold_created record that stands for an ask's decision,
// with the door the call came through (transport), as the decision
// record has it.
func (c *toolCall) inputFields() map[string]any {
	f := map[string]any{}
	if c.rec.Transport != "" {
		f[call.KeyTransport] = string(c.rec.Transport)
	}
	if c.rec.Listener != "" {
		f[call.KeyListener] = c.rec.Listener
	}
	if c.rec.Input != nil {
		f[call.KeyInput] = c.rec.Input
	}
	if c.rec.InputCut != "" {
		f[call.KeyInputCut], f[call.KeyInputSize], f[call.KeyInputTruncated] = c.rec.InputCut, c.rec.InputSize, true
	}
	return f
}
