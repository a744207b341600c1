package audit

import (
	"encoding/json"
	"slices"
	"strconv"
	"time"
	"unicode/utf8"
)

// appendRecord appends the encoding/json output of rec (HTML escaping on,
// as json.Marshal does) for the field value types the gateway uses: string,
// bool, int, int64, uint64 and nil. It returns false, having appended
// nothing usable, for anything else (and for times json.Marshal refuses);
// encode then falls back to json.Marshal. The two must agree byte for byte:
// the line's hash is over these bytes and the package documents them as
// encoding/json's (FuzzAppendRecord holds them to it).
func appendRecord(dst []byte, rec *Record) ([]byte, bool) {
	dst, ok := appendRecordHead(dst, rec)
	if !ok {
		return dst, false
	}
	if dst, ok = appendRecordBody(dst, rec); !ok {
		return dst, false
	}
	return appendRecordHash(dst, rec.Hash), true
}

// appendRecordHead appends the fields the writer fills first: seq, time
// and prev, from the opening brace.
func appendRecordHead(dst []byte, rec *Record) ([]byte, bool) {
	if y := rec.Time.Year(); y < 0 || y > 9999 {
		return dst, false
	}
	dst = append(dst, `{"seq":`...)
	dst = strconv.AppendUint(dst, rec.Seq, 10)
	dst = append(dst, `,"time":"`...)
	dst = rec.Time.AppendFormat(dst, time.RFC3339Nano)
	dst = append(dst, `","prev":`...)
	return appendJSONString(dst, rec.Prev), true
}

// appendRecordBody appends the caller's fields, request_id, event and
// fields, each after a comma: the part of the line Append encodes before
// the record reaches the writer.
func appendRecordBody(dst []byte, rec *Record) ([]byte, bool) {
	dst = append(dst, `,"request_id":`...)
	dst = appendJSONString(dst, rec.RequestID)
	dst = append(dst, `,"event":`...)
	dst = appendJSONString(dst, rec.Event)
	if rec.Replica != "" {
		dst = append(dst, `,"replica":`...)
		dst = appendJSONString(dst, rec.Replica)
	}
	if len(rec.Fields) == 0 && len(rec.Sorted) > 0 {
		dst = append(dst, `,"fields":{`...)
		for i, f := range rec.Sorted {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, f.Key)
			dst = append(dst, ':')
			var ok bool
			if dst, ok = appendValue(dst, f.Value); !ok {
				return dst, false
			}
		}
		return append(dst, '}'), true
	}
	if len(rec.Fields) > 0 {
		keys := make([]string, 0, len(rec.Fields))
		for k := range rec.Fields {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		dst = append(dst, `,"fields":{`...)
		for i, k := range keys {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, k)
			dst = append(dst, ':')
			var ok bool
			if dst, ok = appendValue(dst, rec.Fields[k]); !ok {
				return dst, false
			}
		}
		dst = append(dst, '}')
	}
	return dst, true
}

// appendValue appends a field value of a type the fast encoder takes.
func appendValue(dst []byte, v any) ([]byte, bool) {
	switch v := v.(type) {
	case string:
		return appendJSONString(dst, v), true
	case int:
		return strconv.AppendInt(dst, int64(v), 10), true
	case int64:
		return strconv.AppendInt(dst, v, 10), true
	case uint64:
		return strconv.AppendUint(dst, v, 10), true
	case bool:
		return strconv.AppendBool(dst, v), true
	case nil:
		return append(dst, "null"...), true
	case Encoded:
		// The gateway's own encoding (call.EncodedJSON): already
		// json.Marshal's bytes, so written with no scan.
		if b := v.EncodedJSON(); len(b) > 0 {
			return append(dst, b...), true
		}
	case json.RawMessage:
		// JSON from outside: taken as is only when it is already what encoding/json makes
		// of it (compact, HTML-escaped): a decision's recorded input is
		// json.Marshal output, so the common case costs one scan.
		if v != nil && compactEscaped(v) && json.Valid(v) {
			return append(dst, v...), true
		}
	}
	return dst, false
}

// Encoded is a field value whose bytes the gateway encoded itself with
// encoding/json or a byte-exact equivalent (compact, HTML-escaped, valid):
// the fast encoder appends them as they are. Its MarshalJSON must return
// the same bytes, for the fallback. JSON from anywhere else is a
// json.RawMessage, which is checked before it is taken as is.
type Encoded interface {
	EncodedJSON() []byte
}

// compactEscaped reports whether raw JSON has no whitespace outside its
// strings and nothing json.Marshal would escape for HTML (<, >, &,
// U+2028, U+2029): the bytes Marshal's compaction of it gives back.
func compactEscaped(b []byte) bool {
	in := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '<' || c == '>' || c == '&':
			return false
		case c == 0xe2 && i+2 < len(b) && b[i+1] == 0x80 && (b[i+2] == 0xa8 || b[i+2] == 0xa9):
			return false
		case in && c == '\\':
			i++
		case c == '"':
			in = !in
		case !in && (c == ' ' || c == '\t' || c == '\n' || c == '\r'):
			return false
		}
	}
	return true
}

// sortedFields reports whether fs's keys increase strictly, as
// Record.Sorted requires.
func sortedFields(fs []Field) bool {
	for i := 1; i < len(fs); i++ {
		if fs[i-1].Key >= fs[i].Key {
			return false
		}
	}
	return true
}

// appendRecordHash appends the hash field and the closing brace.
func appendRecordHash(dst []byte, hash string) []byte {
	dst = append(dst, `,"hash":`...)
	dst = appendJSONString(dst, hash)
	return append(dst, '}')
}

const hexDigits = "0123456789abcdef"

// appendJSONString is encoding/json's string encoding with HTML escaping.
func appendJSONString(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hexDigits[b>>4], hexDigits[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		if c == utf8.RuneError && size == 1 {
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if c == '\u2028' || c == '\u2029' {
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hexDigits[c&0xF])
			i += size
			start = i
			continue
		}
		i += size
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// AppendJSONString appends s as encoding/json encodes a string (HTML
// escaping on, invalid UTF-8 replaced), for encoders on the hot path that
// must produce exactly what json.Marshal would.
func AppendJSONString(dst []byte, s string) []byte { return appendJSONString(dst, s) }

// foldSorted moves rec.Sorted into rec.Fields.
func foldSorted(rec *Record) {
	if rec.Fields == nil {
		rec.Fields = make(map[string]any, len(rec.Sorted))
	}
	for _, f := range rec.Sorted {
		rec.Fields[f.Key] = f.Value
	}
	rec.Sorted = nil
}
