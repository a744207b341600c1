package audit

import (
	"encoding/json"
	"slices"
	"strconv"
)

// AppendJSONValue appends v as json.Marshal encodes it, without
// reflection for the types encoding/json decodes into (objects, arrays,
// strings, json.Number, bools and nil: a decoded document, as the tool
// call's arguments and Envoy's input are); any other type is handed to
// json.Marshal. Keys are sorted, nil maps and slices are null, strings are
// escaped as AppendJSONString escapes them, and a json.Number that is not a
// JSON number is refused as json.Marshal refuses it. Hot-path encoders use
// it where json.Marshal's reflection over maps was most of their cost;
// TestAppendJSONValueIsMarshal holds the bytes to json.Marshal's.
func AppendJSONValue(dst []byte, v any) ([]byte, error) {
	switch v := v.(type) {
	case nil:
		return append(dst, "null"...), nil
	case bool:
		return strconv.AppendBool(dst, v), nil
	case string:
		return appendJSONString(dst, v), nil
	case json.Number:
		if validNumber(string(v)) {
			return append(dst, v...), nil
		}
	case []any:
		if v == nil {
			return append(dst, "null"...), nil
		}
		dst = append(dst, '[')
		for i, e := range v {
			if i > 0 {
				dst = append(dst, ',')
			}
			var err error
			if dst, err = AppendJSONValue(dst, e); err != nil {
				return nil, err
			}
		}
		return append(dst, ']'), nil
	case map[string]any:
		if v == nil {
			return append(dst, "null"...), nil
		}
		var kb [16]string // most objects are small: sorted without allocating
		dst = append(dst, '{')
		for i, k := range sortedKeys(kb[:0], v) {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = append(appendJSONString(dst, k), ':')
			var err error
			if dst, err = AppendJSONValue(dst, v[k]); err != nil {
				return nil, err
			}
		}
		return append(dst, '}'), nil
	}
	b, err := json.Marshal(v) // "" as json.Number (0), an invalid one (refused), anything unforeseen
	if err != nil {
		return nil, err
	}
	return append(dst, b...), nil
}

// AppendJSONStrings appends ss as json.Marshal encodes a []string (nil is
// null).
func AppendJSONStrings(dst []byte, ss []string) []byte {
	if ss == nil {
		return append(dst, "null"...)
	}
	dst = append(dst, '[')
	for i, s := range ss {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, s)
	}
	return append(dst, ']')
}

// AppendJSONStringLists appends m as json.Marshal encodes a
// map[string][]string, such as HTTP headers: nil is null, keys sorted.
func AppendJSONStringLists(dst []byte, m map[string][]string) []byte {
	if m == nil {
		return append(dst, "null"...)
	}
	var kb [16]string
	dst = append(dst, '{')
	for i, k := range sortedKeys(kb[:0], m) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = AppendJSONStrings(append(appendJSONString(dst, k), ':'), m[k])
	}
	return append(dst, '}')
}

// AppendJSONStringMap appends m as json.Marshal encodes a
// map[string]string: keys sorted, null for a nil map.
func AppendJSONStringMap(dst []byte, m map[string]string) []byte {
	if m == nil {
		return append(dst, "null"...)
	}
	var kb [16]string
	dst = append(dst, '{')
	for i, k := range sortedKeys(kb[:0], m) {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(append(appendJSONString(dst, k), ':'), m[k])
	}
	return append(dst, '}')
}

// sortedKeys appends m's keys to buf, sorted as json.Marshal sorts them.
func sortedKeys[V any](buf []string, m map[string]V) []string {
	for k := range m {
		buf = append(buf, k)
	}
	slices.Sort(buf)
	return buf
}

// validNumber is JSON's number grammar, which json.Marshal holds a
// json.Number to: -?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?
func validNumber(s string) bool {
	i := 0
	digits := func() int {
		n := 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			i++
			n++
		}
		return n
	}
	if i < len(s) && s[i] == '-' {
		i++
	}
	switch {
	case i < len(s) && s[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(s) && s[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(s)
}
