package audit

import (
	"bytes"
	"encoding/json"
	"strconv"
	"unicode/utf8"
)

// envelope reads a line written in the writer's own layout (appendLine:
// seq, time, prev, request_id, event, replica if set, fields if any,
// hash — in that order, strings without escapes) into rec without
// encoding/json's reflection: the fields are checked with json.Valid and
// left as bytes. It accepts only lines the strict decoder of
// checkLineLight decodes to the same Line (TestEnvelopeMatchesDecoder
// and FuzzEnvelope check it); any other line, well-formed or not, is
// false and goes to the decoder. The self-hash is checked by the caller.
func envelope(line []byte, rec *Line) bool {
	const tail = 64 + len(`"}`)
	end := len(line) - tail - len(hashSuffix) // where the hash member starts
	if end < 0 || !bytes.Equal(line[end:end+len(hashSuffix)], hashSuffix) || !bytes.HasSuffix(line, []byte(`"}`)) {
		return false
	}
	i := 0
	lit := func(s string) bool {
		if len(line)-i >= len(s) && string(line[i:i+len(s)]) == s {
			i += len(s)
			return true
		}
		return false
	}
	// str reads a string's body up to its closing quote: no escape, no
	// control character, valid UTF-8 (encoding/json would change those).
	str := func() (string, bool) {
		j := i
		for j < end && line[j] != '"' {
			if line[j] == '\\' || line[j] < 0x20 {
				return "", false
			}
			j++
		}
		if j >= end || !utf8.Valid(line[i:j]) {
			return "", false
		}
		s := string(line[i:j])
		i = j + 1
		return s, true
	}
	if !lit(`{"seq":`) {
		return false
	}
	j := i
	for j < end && line[j] >= '0' && line[j] <= '9' {
		j++
	}
	if j == i || (line[i] == '0' && j > i+1) {
		return false
	}
	seq, err := strconv.ParseUint(string(line[i:j]), 10, 64)
	if err != nil {
		return false
	}
	i = j
	if !lit(`,"time":"`) {
		return false
	}
	ts := i - 1
	if _, ok := str(); !ok {
		return false
	}
	var r Line
	if r.Time.UnmarshalJSON(line[ts:i]) != nil {
		return false
	}
	r.Seq = seq
	var ok bool
	if !lit(`,"prev":"`) {
		return false
	}
	if r.Prev, ok = str(); !ok || !lit(`,"request_id":"`) {
		return false
	}
	if r.RequestID, ok = str(); !ok || !lit(`,"event":"`) {
		return false
	}
	if r.Event, ok = str(); !ok {
		return false
	}
	if lit(`,"replica":"`) {
		if r.Replica, ok = str(); !ok {
			return false
		}
	}
	switch {
	case i == end:
	case lit(`,"fields":`):
		f := line[i:end]
		if len(f) == 0 || f[0] != '{' || !json.Valid(f) {
			return false
		}
		r.Fields = f
	default:
		return false
	}
	h := line[end+len(hashSuffix) : len(line)-2]
	for _, c := range h { // lower-case hex, as the writer writes it
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	r.Hash = string(h)
	*rec = r
	return true
}
