package connectors

import "encoding/json"

// fastArgs decodes the arguments documents DecodeArgs accepts, in one pass
// over the bytes, to exactly the values encoding/json's decoder gives
// them (DecodeArgs' token-by-token decoding cost more than the schema
// validation: a token boxed per value, a scanner step per byte, twice).
//
// It handles only what it is sure of: a document it would refuse, or one
// with anything it does not decode itself (a \u escape, a control byte, a
// duplicate key, an unknown top-level key, depth past maxArgsDepth), is
// not decoded here (ok false), and DecodeArgs decodes it with
// encoding/json as before, which then accepts or refuses it with the same
// value or error as it always did. So there is still one reading of a
// document: a document this accepts, encoding/json accepts with the same
// values (FuzzFastArgsMatchesDecoder holds it), and every refusal comes
// from encoding/json. The caller has checked the size and that data is
// valid UTF-8.
func fastArgs(data []byte) (args Args, ok bool) {
	p := argsParser{b: data}
	if !p.byte('{') {
		return Args{}, false
	}
	var seen [4]bool // path, query, headers, body
	if !p.byte('}') {
		for {
			key, ok := p.str()
			if !ok || !p.byte(':') {
				return Args{}, false
			}
			i := topKey(key)
			if i < 0 || seen[i] {
				return Args{}, false
			}
			seen[i] = true
			v, ok := p.value(1)
			if !ok {
				return Args{}, false
			}
			if i < 3 { // path, query, headers: an object, or null for none
				if v != nil {
					obj, isObj := v.(map[string]any)
					if !isObj {
						return Args{}, false
					}
					switch i {
					case 0:
						args.Path = obj
					case 1:
						args.Query = obj
					default:
						args.Headers = obj
					}
				}
			} else {
				args.Body = v
			}
			if p.byte('}') {
				break
			}
			if !p.byte(',') {
				return Args{}, false
			}
		}
	}
	p.space()
	if p.i != len(p.b) {
		return Args{}, false
	}
	return args, true
}

// topKey is key's index among the document's keys, or -1.
func topKey(key string) int {
	switch key {
	case "path":
		return 0
	case "query":
		return 1
	case "headers":
		return 2
	case "body":
		return 3
	}
	return -1
}

type argsParser struct {
	b []byte
	i int
}

// space skips JSON whitespace (space, tab, line feed, carriage return).
func (p *argsParser) space() {
	for p.i < len(p.b) && (p.b[p.i] == ' ' || p.b[p.i] == '\t' || p.b[p.i] == '\n' || p.b[p.i] == '\r') {
		p.i++
	}
}

// byte consumes c after whitespace, if it is next.
func (p *argsParser) byte(c byte) bool {
	p.space()
	if p.i < len(p.b) && p.b[p.i] == c {
		p.i++
		return true
	}
	return false
}

// value decodes one value at depth (a top-level argument is at 1).
func (p *argsParser) value(depth int) (any, bool) {
	if depth > maxArgsDepth {
		return nil, false
	}
	p.space()
	if p.i >= len(p.b) {
		return nil, false
	}
	switch c := p.b[p.i]; {
	case c == '{':
		p.i++
		obj := map[string]any{}
		if p.byte('}') {
			return obj, true
		}
		for {
			k, ok := p.str()
			if !ok || !p.byte(':') {
				return nil, false
			}
			if _, dup := obj[k]; dup {
				return nil, false
			}
			v, ok := p.value(depth + 1)
			if !ok {
				return nil, false
			}
			obj[k] = v
			if p.byte('}') {
				return obj, true
			}
			if !p.byte(',') {
				return nil, false
			}
		}
	case c == '[':
		p.i++
		arr := []any{}
		if p.byte(']') {
			return arr, true
		}
		for {
			v, ok := p.value(depth + 1)
			if !ok {
				return nil, false
			}
			arr = append(arr, v)
			if p.byte(']') {
				return arr, true
			}
			if !p.byte(',') {
				return nil, false
			}
		}
	case c == '"':
		return p.str()
	case c == '-' || (c >= '0' && c <= '9'):
		return p.number()
	default:
		for _, lit := range [...]struct {
			text string
			v    any
		}{{"true", true}, {"false", false}, {"null", nil}} {
			if len(p.b)-p.i >= len(lit.text) && string(p.b[p.i:p.i+len(lit.text)]) == lit.text {
				p.i += len(lit.text)
				return lit.v, true
			}
		}
		return nil, false
	}
}

// str decodes a string after whitespace. Escapes other than \uXXXX are
// decoded; a \u escape or a control byte is not handled here.
func (p *argsParser) str() (string, bool) {
	p.space()
	if p.i >= len(p.b) || p.b[p.i] != '"' {
		return "", false
	}
	p.i++
	start := p.i
	for p.i < len(p.b) {
		switch c := p.b[p.i]; {
		case c == '"':
			s := string(p.b[start:p.i])
			p.i++
			return s, true
		case c == '\\':
			return p.escaped(start)
		case c < 0x20:
			return "", false
		}
		p.i++
	}
	return "", false
}

// escaped finishes a string begun at start whose escape is at p.i.
func (p *argsParser) escaped(start int) (string, bool) {
	out := append(make([]byte, 0, p.i-start+16), p.b[start:p.i]...)
	for p.i < len(p.b) {
		c := p.b[p.i]
		switch {
		case c == '"':
			p.i++
			return string(out), true
		case c < 0x20:
			return "", false
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.b) {
			return "", false
		}
		var r byte
		switch p.b[p.i+1] {
		case '"', '\\', '/':
			r = p.b[p.i+1]
		case 'b':
			r = '\b'
		case 'f':
			r = '\f'
		case 'n':
			r = '\n'
		case 'r':
			r = '\r'
		case 't':
			r = '\t'
		default: // \u, or not an escape
			return "", false
		}
		out = append(out, r)
		p.i += 2
	}
	return "", false
}

// number decodes a number in JSON's grammar
// (-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?) as its text.
func (p *argsParser) number() (any, bool) {
	start := p.i
	if p.b[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.b) && p.b[p.i] == '0':
		p.i++
	case p.digits() == 0:
		return nil, false
	}
	if p.i < len(p.b) && p.b[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return nil, false
		}
	}
	if p.i < len(p.b) && (p.b[p.i] == 'e' || p.b[p.i] == 'E') {
		p.i++
		if p.i < len(p.b) && (p.b[p.i] == '+' || p.b[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return nil, false
		}
	}
	return json.Number(p.b[start:p.i]), true
}

// digits consumes [0-9]* and says how many.
func (p *argsParser) digits() int {
	n := 0
	for p.i < len(p.b) && p.b[p.i] >= '0' && p.b[p.i] <= '9' {
		p.i++
		n++
	}
	return n
}
