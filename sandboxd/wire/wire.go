// Package wire is the one format sandboxd and the gateway both speak: the
// identity preamble line that starts every relayed connection,
// "SLUICE-IDENTITY {json}\n", and the handoff line
// "SLUICE-HANDOFF {json}\n" that instead passes the sandbox's connection
// itself to the gateway (handoff.go). It imports nothing of sluice.
//
// The preamble is parsed strictly so that sandboxd and the gateway can never
// disagree about who a connection belongs to: exact prefix, one JSON object
// whose keys match exactly (no case folding, no duplicates, no unknown keys,
// string values only), nothing after the object but the newline, and fields
// that are short, valid UTF-8 and free of control characters.
package wire

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"unicode"
	"unicode/utf8"
)

// Prefix starts the preamble line.
const Prefix = "SLUICE-IDENTITY "

// MaxLine bounds the preamble line, newline included.
const MaxLine = 4096

// MaxField bounds each Identity field, in bytes.
const MaxField = 256

// Identity is who a relayed connection belongs to.
type Identity struct {
	Sandbox string `json:"sandbox"`
	Agent   string `json:"agent"`
	Session string `json:"session"`
	User    string `json:"user"`
	Host    string `json:"host"`
	// Egress narrows the agent's raw egress allowlist for this sandbox
	// (sandboxd create/run --egress): "" is no narrowing, otherwise the
	// canonical list FormatEgress makes. The gateway allows a host only
	// when both the agent's allowlist (its policy) and this list do; a
	// narrowing can never widen.
	Egress string `json:"egress,omitempty"`
}

// MaxEgress bounds Identity.Egress, in bytes.
const MaxEgress = 1024

// Errors returned (wrapped) by Read, for callers that classify failures.
var (
	ErrMissingPrefix = errors.New("wire: preamble missing prefix")
	ErrTooLong       = errors.New("wire: preamble line too long")
	ErrNoNewline     = errors.New("wire: preamble not terminated by newline")
)

// Validate checks the rules Encode and Read both enforce: Sandbox and Agent
// set, every field at most MaxField bytes of printable UTF-8.
func (id Identity) Validate() error {
	for _, f := range id.fields() {
		if f.name == "egress" {
			if _, err := ParseEgress(*f.v); err != nil {
				return err
			}
			continue
		}
		if err := validField(f.name, *f.v, f.required); err != nil {
			return err
		}
	}
	return nil
}

type field struct {
	name     string
	v        *string
	required bool
}

// fields lists the JSON names in encoding order, bound to id's fields.
func (id *Identity) fields() []field {
	return []field{
		{"sandbox", &id.Sandbox, true},
		{"agent", &id.Agent, true},
		{"session", &id.Session, false},
		{"user", &id.User, false},
		{"host", &id.Host, false},
		{"egress", &id.Egress, false},
	}
}

func validField(name, v string, required bool) error {
	if v == "" {
		if required {
			return fmt.Errorf("wire: identity field %s is required", name)
		}
		return nil
	}
	if len(v) > MaxField {
		return fmt.Errorf("wire: identity field %s longer than %d bytes", name, MaxField)
	}
	if !utf8.ValidString(v) {
		return fmt.Errorf("wire: identity field %s is not valid UTF-8", name)
	}
	for _, r := range v {
		// IsPrint excludes control characters (C0, DEL, C1) and every
		// space except U+0020, including U+2028/U+2029 line separators.
		if !unicode.IsPrint(r) {
			return fmt.Errorf("wire: identity field %s contains non-printable character %U", name, r)
		}
	}
	return nil
}

// Encode returns the preamble line for id, newline included. Fields must be
// printable, without control characters; Agent and Sandbox must be set.
func Encode(id Identity) ([]byte, error) { return encode(id, Prefix) }

// encode builds a preamble line that starts with prefix (Prefix or
// HandoffPrefix); both lines share every other rule.
func encode(id Identity, prefix string) ([]byte, error) {
	if err := id.Validate(); err != nil {
		return nil, fmt.Errorf("wire: encode: %w", err)
	}
	js, err := json.Marshal(id)
	if err != nil {
		return nil, fmt.Errorf("wire: encode: %w", err)
	}
	line := make([]byte, 0, len(prefix)+len(js)+1)
	line = append(line, prefix...)
	line = append(line, js...)
	line = append(line, '\n')
	if len(line) > MaxLine {
		// Unreachable with MaxField=256 and five fields, but keep the
		// invariant that Encode never produces what Read refuses.
		return nil, fmt.Errorf("wire: encode: %w", ErrTooLong)
	}
	return line, nil
}

// Read reads exactly one preamble line from r (never more than MaxLine bytes),
// strictly: the prefix, one JSON object with only known fields, and "\n".
//
// Read consumes nothing after the newline: the caller keeps using r for the
// relayed stream (for example http.ReadRequest(r)), and the bytes that follow
// the preamble are still buffered in r. On error the connection must be
// closed; how much of it was consumed is unspecified.
func Read(r *bufio.Reader) (Identity, error) {
	line, err := readLine(r)
	if err != nil {
		return Identity{}, err
	}
	return parse(line)
}

// readLine returns the line without its '\n'. It reads byte by byte from the
// buffer so that it stops exactly at the newline and never past MaxLine.
func readLine(r *bufio.Reader) ([]byte, error) {
	var line []byte
	for len(line) < MaxLine {
		c, err := r.ReadByte()
		if err != nil {
			if errors.Is(err, io.EOF) {
				if len(line) == 0 {
					return nil, fmt.Errorf("wire: read preamble: %w", io.ErrUnexpectedEOF)
				}
				return nil, ErrNoNewline
			}
			return nil, fmt.Errorf("wire: read preamble: %w", err)
		}
		if c == '\n' {
			return line, nil
		}
		line = append(line, c)
		// Fail fast on a connection that does not start with the prefix
		// (an HTTP request line, say) rather than reading up to MaxLine.
		if n := len(line); n <= len(Prefix) && line[n-1] != Prefix[n-1] {
			return nil, ErrMissingPrefix
		}
	}
	return nil, fmt.Errorf("%w (limit %d bytes)", ErrTooLong, MaxLine)
}

func parse(line []byte) (Identity, error) { return parseLine(line, Prefix) }

// parseLine parses line (without its newline) as prefix followed by the
// identity object, with the same strict rules for either prefix.
func parseLine(line []byte, prefix string) (Identity, error) {
	rest, ok := bytes.CutPrefix(line, []byte(prefix))
	if !ok {
		return Identity{}, ErrMissingPrefix
	}
	if !utf8.Valid(rest) {
		return Identity{}, errors.New("wire: preamble is not valid UTF-8")
	}
	var id Identity
	if err := decodeObject(rest, &id); err != nil {
		return Identity{}, err
	}
	if err := id.Validate(); err != nil {
		return Identity{}, err
	}
	return id, nil
}

// decodeObject walks the JSON tokens itself instead of json.Unmarshal so that
// keys match exactly: encoding/json folds case ("AGENT" sets Agent), accepts
// null for strings and lets a duplicate key silently win, all of which would
// let two parsers read one preamble differently.
func decodeObject(b []byte, id *Identity) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	tok, err := dec.Token()
	if err != nil {
		return fmt.Errorf("wire: decode preamble: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return errors.New("wire: decode preamble: not a JSON object")
	}
	fields := id.fields()
	seen := make(map[string]bool, len(fields))
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return fmt.Errorf("wire: decode preamble: %w", err)
		}
		key, _ := tok.(string) // object keys are always strings
		var dst *string
		for _, f := range fields {
			if f.name == key {
				dst = f.v
			}
		}
		if dst == nil {
			return fmt.Errorf("wire: decode preamble: unknown field %q", truncate(key))
		}
		if seen[key] {
			return fmt.Errorf("wire: decode preamble: duplicate field %q", key)
		}
		seen[key] = true
		tok, err = dec.Token()
		if err != nil {
			return fmt.Errorf("wire: decode preamble: %w", err)
		}
		v, ok := tok.(string)
		if !ok {
			return fmt.Errorf("wire: decode preamble: field %q is not a string", key)
		}
		*dst = v
	}
	if _, err := dec.Token(); err != nil { // the closing '}'
		return fmt.Errorf("wire: decode preamble: %w", err)
	}
	if dec.InputOffset() != int64(len(b)) {
		return errors.New("wire: decode preamble: trailing data after JSON object")
	}
	return nil
}

// truncate bounds attacker-chosen text quoted in an error.
func truncate(s string) string {
	if len(s) > 32 {
		return s[:32] + "…"
	}
	return s
}
