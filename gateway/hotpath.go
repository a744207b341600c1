package gateway

import (
	"bytes"
	"encoding/json"
	"strconv"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/call"
)

// appendResult appends the 200 answer of a sent call, exactly as
// json.Marshal(replyBody(o)) would encode it, without reflection and
// without a second scan of a JSON reply body: roundTrip validated it
// already (json.Valid), and a body that is compact with nothing to escape
// (the common case, and what any JSON encoder writes) is copied as it is.
// ok is false for a body of another type, which the caller encodes with
// encoding/json.
func appendResult(dst []byte, r *call.Reply, requestID string) (_ []byte, ok bool) {
	if r == nil {
		return dst, false
	}
	dst = append(dst, `{"status":`...)
	dst = strconv.AppendInt(dst, int64(r.Status), 10)
	dst = append(dst, `,"headers":`...)
	dst = audit.AppendJSONStringLists(dst, r.Headers)
	dst = append(dst, `,"body":`...)
	switch b := r.Body.(type) {
	case nil:
		dst = append(dst, "null"...)
	case string:
		dst = audit.AppendJSONString(dst, b)
	case json.RawMessage:
		if b == nil {
			dst = append(dst, "null"...)
			break
		}
		if !plainJSON(b) {
			// What encoding/json does to a RawMessage: compact it (which
			// also validates it) and escape HTML.
			var c bytes.Buffer
			if err := json.Compact(&c, b); err != nil {
				return dst, false
			}
			var e bytes.Buffer
			json.HTMLEscape(&e, c.Bytes())
			dst = append(dst, e.Bytes()...)
			break
		}
		dst = append(dst, b...)
	default:
		return dst, false
	}
	if r.BodyEncoding != "" {
		dst = append(dst, `,"body_encoding":`...)
		dst = audit.AppendJSONString(dst, r.BodyEncoding)
	}
	dst = append(dst, `,"request_id":`...)
	dst = audit.AppendJSONString(dst, requestID)
	return append(dst, '}'), true
}

// plainJSON says whether a valid JSON text is already what encoding/json
// would write for it: no whitespace (none is needed between tokens, so
// any is insignificant or inside a string, where json.Marshal keeps it
// escaped anyway) and nothing it escapes for HTML (<, >, &, U+2028 and
// U+2029, whose UTF-8 encodings start with 0xE2).
func plainJSON(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r', '<', '>', '&', 0xE2:
			return false
		}
	}
	return true
}
