package connectors

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"mime/multipart"
	"net/textproto"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/getkin/kin-openapi/openapi3"
)

// Media types this package sends besides JSON.
const (
	multipartType = "multipart/form-data"
	octetType     = "application/octet-stream"
)

// filenameSuffix names the optional sibling property that carries a file
// part's filename in a multipart body: {"file": "<base64>",
// "file_filename": "a.png"}. Without it the filename is the property name.
const filenameSuffix = "_filename"

// maxFilenameBytes caps a multipart filename.
const maxFilenameBytes = 255

// style is how one parameter or form property is serialised (OpenAPI 3.0.3
// §4.7.12.4 and §4.7.14.5).
type style struct {
	name    string // "form", "spaceDelimited", "pipeDelimited" or "deepObject"
	explode bool
	// json sends the value as JSON text (a form property whose encoding
	// says contentType application/json, or an object with no encoding).
	json bool
	// declared is false for a form property with no encoding entry: its
	// objects go as JSON text and its arrays must hold scalars.
	declared bool
}

// pair is one serialised key with its value or values. A value list with a
// separator is written joined (style form without explode, space- and
// pipe-delimited); flat marks a key taken from inside an exploded object,
// which must not collide with a sibling's name.
type pair struct {
	key  string
	vals []string
	sep  string // already escaped: ",", "%20" or "%7C"
	flat bool
	// field names the value in errors (set on flat pairs).
	field string
}

// serialise turns one value into key/value pairs. Every value is either
// represented exactly or refused: Validate runs it too, so nothing is
// checked that the encoder cannot send.
func serialise(name string, v any, st style, field string) ([]pair, error) {
	if st.json {
		if isScalar(v) {
			return []pair{{key: name, vals: []string{scalarString(v)}}}, nil
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, &ArgError{Field: field, Reason: "cannot encode as JSON"}
		}
		return []pair{{key: name, vals: []string{string(b)}}}, nil
	}
	if st.name == "deepObject" {
		var out []pair
		return out, deep(name, v, field, &out)
	}
	switch x := v.(type) {
	case []any:
		items := make([]string, 0, len(x))
		for i, e := range x {
			if !isScalar(e) {
				reason := "must be a string, number or boolean"
				if !st.declared {
					reason = "arrays of objects or arrays need an encoding with style deepObject"
				}
				return nil, &ArgError{Field: field + "[" + strconv.Itoa(i) + "]", Reason: reason}
			}
			items = append(items, scalarString(e))
		}
		if len(items) == 0 {
			return nil, nil
		}
		if st.name == "form" && st.explode {
			out := make([]pair, len(items))
			for i, it := range items {
				out[i] = pair{key: name, vals: []string{it}}
			}
			return out, nil
		}
		sep := map[string]string{"form": ",", "spaceDelimited": "%20", "pipeDelimited": "%7C"}[st.name]
		if sep == "" {
			return nil, &ArgError{Field: field, Reason: "arrays are not supported in style " + st.name}
		}
		return []pair{{key: name, vals: items, sep: sep}}, nil
	case map[string]any:
		if st.name != "form" {
			return nil, &ArgError{Field: field, Reason: "objects are not supported in style " + st.name}
		}
		keys := sortedKeys(x)
		for _, k := range keys {
			if !isScalar(x[k]) {
				return nil, &ArgError{Field: field + "." + k, Reason: "must be a string, number or boolean (nested values need style deepObject)"}
			}
		}
		if st.explode {
			out := make([]pair, 0, len(keys))
			for _, k := range keys {
				if k == "" {
					return nil, &ArgError{Field: field, Reason: "an empty key cannot be sent in style form"}
				}
				out = append(out, pair{key: k, vals: []string{scalarString(x[k])}, flat: true, field: field + "." + k})
			}
			return out, nil
		}
		vals := make([]string, 0, 2*len(keys))
		for _, k := range keys {
			vals = append(vals, k, scalarString(x[k]))
		}
		if len(vals) == 0 {
			return nil, nil
		}
		return []pair{{key: name, vals: vals, sep: ","}}, nil
	case nil:
		return nil, &ArgError{Field: field, Reason: "null cannot be sent here"}
	default:
		if !isScalar(v) {
			return nil, &ArgError{Field: field, Reason: "unsupported value"}
		}
		return []pair{{key: name, vals: []string{scalarString(v)}}}, nil
	}
}

// deep writes v in bracket notation, as Stripe, Rack and PHP read it:
// objects as prefix[key], arrays of scalars as prefix[]=v and arrays holding
// objects or arrays as prefix[0][key]. Keys holding brackets, and empty
// keys, are refused: they would read back as a different structure.
func deep(prefix string, v any, field string, out *[]pair) error {
	switch x := v.(type) {
	case map[string]any:
		for _, k := range sortedKeys(x) {
			if k == "" || strings.ContainsAny(k, "[]") {
				return &ArgError{Field: field + "." + k, Reason: "a key sent in brackets must be non-empty and hold no [ or ]"}
			}
			if err := deep(prefix+"["+k+"]", x[k], field+"."+k, out); err != nil {
				return err
			}
		}
		return nil
	case []any:
		scalars := true
		for _, e := range x {
			scalars = scalars && isScalar(e)
		}
		for i, e := range x {
			sub := field + "[" + strconv.Itoa(i) + "]"
			if scalars {
				*out = append(*out, pair{key: prefix + "[]", vals: []string{scalarString(e)}})
				continue
			}
			if err := deep(prefix+"["+strconv.Itoa(i)+"]", e, sub, out); err != nil {
				return err
			}
		}
		return nil
	case nil:
		return &ArgError{Field: field, Reason: "null cannot be sent in style deepObject"}
	default:
		if !isScalar(v) {
			return &ArgError{Field: field, Reason: "unsupported value"}
		}
		*out = append(*out, pair{key: prefix, vals: []string{scalarString(v)}})
		return nil
	}
}

// checkCollisions refuses a key taken from inside an exploded object that
// a server would read as a declared sibling ("amount", "filter[x]"), and a
// key sent by two values: the upstream would take it for the sibling,
// which was checked against another schema.
func checkCollisions(all [][]pair, declared map[string]bool, field string) error {
	owner := map[string]int{}
	for i, ps := range all {
		for _, p := range ps {
			f := p.field
			if f == "" {
				f = field + "." + p.key
			}
			if p.flat && readsAs(p.key, declared) {
				return &ArgError{Field: f, Reason: "an exploded key must not read as another value's name"}
			}
			if o, ok := owner[p.key]; ok && o != i {
				return &ArgError{Field: f, Reason: "this key is sent by two values"}
			}
			owner[p.key] = i
		}
	}
	return nil
}

// readsAs reports whether a server would read key as (part of) a declared
// name: the name itself or name[...] in bracket notation.
func readsAs(key string, declared map[string]bool) bool {
	if declared[key] {
		return true
	}
	if i := strings.IndexByte(key, '['); i >= 0 {
		return declared[key[:i]]
	}
	return false
}

// writePairs writes pairs as a query string or form body. Keys are always
// escaped; values with esc.
func writePairs(pairs []pair, esc func(string) string) string {
	var b strings.Builder
	for i, p := range pairs {
		if i > 0 {
			b.WriteByte('&')
		}
		b.WriteString(url.QueryEscape(p.key))
		b.WriteByte('=')
		for j, v := range p.vals {
			if j > 0 {
				b.WriteString(p.sep)
			}
			b.WriteString(esc(v))
		}
	}
	return b.String()
}

// escapeReserved escapes a query value whose parameter has allowReserved:
// RFC 3986 reserved characters stay as they are, except "&", "=", "+", "#"
// and ";", which would end the value, start another parameter, read as a
// space, end the query, or split parameters at servers that take ";" as a
// separator (parameter cloaking, CVE-2021-23336); "%" is always escaped, so
// no value smuggles an escape.
func escapeReserved(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', strings.IndexByte("-._~:/?@!$'()*,[]", c) >= 0:
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// bodyKind says how a request body is sent.
type bodyKind int

const (
	bodyJSON bodyKind = iota
	bodyForm
	bodyMultipart
	bodyBinary
)

// part is how one multipart property is sent.
type part struct {
	binary      bool   // a format: binary string (or array of them): base64 in the args, bytes on the wire
	contentType string // the part's Content-Type for a file ("" for text parts)
	filename    string // the sibling property naming the file, "" if none
}

// bodyCodec is how a tool's request body is checked and encoded; it comes
// from the media type's schema and encoding map.
type bodyCodec struct {
	kind        bodyKind
	contentType string           // sent for a binary body
	form        map[string]style // form properties with an encoding entry
	declared    map[string]bool  // the schema's top-level property names
	parts       map[string]part  // multipart properties
	filenames   map[string]bool  // the filename sibling properties
}

// setBody picks the operation's request body media type and prepares its
// codec. A non-empty skip says why no tool can be made: an encoding this
// package cannot send faithfully skips the operation, not the connector.
func (t *Tool) setBody(rb *openapi3.RequestBodyRef) (skip string, err error) {
	if rb == nil {
		return "", nil
	}
	if rb.Value == nil {
		return "", errors.New("requestBody: unresolved")
	}
	mt, media := pickMedia(rb.Value.Content)
	if mt == "" {
		return "request body has no JSON, form, multipart or binary media type", nil
	}
	t.BodyType = mt
	t.bodyRequired = rb.Value.Required
	t.body = &openapi3.Schema{}
	if media.Schema != nil && media.Schema.Value != nil {
		t.body = media.Schema.Value
	}
	c := &bodyCodec{declared: map[string]bool{}}
	for name := range t.body.Properties {
		c.declared[name] = true
	}
	switch {
	case mt == formType:
		c.kind = bodyForm
		c.form = map[string]style{}
		for name, e := range media.Encoding {
			if e == nil {
				continue
			}
			st, err := formStyle(e)
			if err != nil {
				return fmt.Sprintf("request body encoding %s: %v", name, err), nil
			}
			c.form[name] = st
		}
	case mt == multipartType:
		c.kind = bodyMultipart
		if err := c.multipart(t, media); err != nil {
			return "request body: " + err.Error(), nil
		}
	case isBinaryType(mt):
		c.kind = bodyBinary
		c.contentType = mt
		if strings.Contains(mt, "*") {
			c.contentType = octetType
		}
		t.body = &openapi3.Schema{Type: &openapi3.Types{"string"}, Format: "binary"}
	}
	t.codec = c
	return "", nil
}

// formStyle reads one form property's encoding entry. Defaults follow
// OpenAPI 3.0.3 §4.7.14.5: style form, explode true for form.
func formStyle(e *openapi3.Encoding) (style, error) {
	st := style{name: e.Style, declared: true}
	if st.name == "" {
		st.name = "form"
		ct, _, _ := strings.Cut(e.ContentType, ",")
		st.json = isJSONType(strings.TrimSpace(ct))
	}
	switch st.name {
	case "form", "spaceDelimited", "pipeDelimited", "deepObject":
	default:
		return style{}, fmt.Errorf("style %q is not supported", st.name)
	}
	st.explode = st.name == "form" || st.name == "deepObject"
	if e.Explode != nil {
		st.explode = *e.Explode
	}
	return st, nil
}

func isJSONType(mt string) bool {
	mt = strings.ToLower(mt)
	return mt == "application/json" || (strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json"))
}

func isBinaryType(mt string) bool {
	return mt == octetType || mt == "*/*" || strings.HasPrefix(mt, "image/")
}

// multipart notes which properties are files (sent with the property's
// encoding.contentType, else its contentMediaType, else
// application/octet-stream) and adds each file's optional
// filename sibling to the body schema, so that the advertised schema and
// the one Validate enforces are one object.
func (c *bodyCodec) multipart(t *Tool, media *openapi3.MediaType) error {
	c.parts = map[string]part{}
	c.filenames = map[string]bool{}
	var added openapi3.Schemas
	names := make([]string, 0, len(t.body.Properties))
	for name := range t.body.Properties {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if !safePartName(name) {
			return fmt.Errorf("property %q: not a safe multipart part name", name)
		}
		ref := t.body.Properties[name]
		if ref == nil || ref.Value == nil {
			continue
		}
		s := ref.Value
		if s.Type.Is("array") && s.Items != nil && s.Items.Value != nil {
			s = s.Items.Value
		}
		if !isBinarySchema(s) {
			continue
		}
		p := part{binary: true, contentType: octetType}
		if mt, _, err := mime.ParseMediaType(s.ContentMediaType); err == nil && !strings.Contains(mt, "*") && !strings.ContainsAny(s.ContentMediaType, "\r\n") {
			p.contentType = s.ContentMediaType
		}
		if e := media.Encoding[name]; e != nil && e.ContentType != "" {
			ct, _, _ := strings.Cut(e.ContentType, ",")
			ct = strings.TrimSpace(ct)
			if mt, _, err := mime.ParseMediaType(ct); err != nil || strings.ContainsAny(ct, "\r\n") {
				return fmt.Errorf("encoding %s: contentType %q is not a media type", name, e.ContentType)
			} else if !strings.Contains(mt, "*") {
				p.contentType = ct
			}
		}
		if fn := name + filenameSuffix; !c.declared[fn] {
			p.filename = fn
			c.filenames[fn] = true
			if added == nil {
				added = maps.Clone(t.body.Properties)
			}
			max := uint64(maxFilenameBytes)
			added[fn] = &openapi3.SchemaRef{Value: &openapi3.Schema{
				Type:        &openapi3.Types{"string"},
				MinLength:   1,
				MaxLength:   &max,
				Description: "filename sent with " + name + " (default: " + name + ")",
			}}
		}
		c.parts[name] = p
	}
	if added != nil {
		cp := *t.body
		cp.Properties = added
		t.body = &cp
	}
	return nil
}

// isBinarySchema reports whether s is a file sent as raw bytes: format
// binary (3.0), contentEncoding binary (as Discord's 3.1 spec writes it), or
// a non-text contentMediaType with no contentEncoding (3.1). A property
// whose contentEncoding is base64 is sent as the base64 text it is.
func isBinarySchema(s *openapi3.Schema) bool {
	if s.Format == "binary" || strings.EqualFold(s.ContentEncoding, "binary") {
		return true
	}
	return s.ContentEncoding == "" && s.ContentMediaType != "" &&
		!strings.HasPrefix(s.ContentMediaType, "text/") && !isJSONType(s.ContentMediaType)
}

// safePartName allows part names that need no escaping to be misread:
// printable ASCII without quotes or backslashes.
func safePartName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x21 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// checkFilename refuses filenames that could split a header or name a path.
func checkFilename(s, field string) error {
	for _, r := range s {
		if r < 0x20 || r == 0x7f {
			return &ArgError{Field: field, Reason: "must not hold control characters (CR or LF would end the part's header)"}
		}
	}
	switch {
	case s == "" || len(s) > maxFilenameBytes:
		return &ArgError{Field: field, Reason: fmt.Sprintf("must be 1 to %d bytes", maxFilenameBytes)}
	case isDotSegment(s) || strings.ContainsAny(s, "/\\"):
		return &ArgError{Field: field, Reason: `must be a bare name: no "/", "\" and not "." or ".."`}
	}
	return nil
}

// decodeBinary decodes a base64 file value (RFC 4648 §4, padded, standard
// alphabet), charging its size to budget.
func decodeBinary(v any, field string, budget *int) ([]byte, error) {
	s, ok := v.(string)
	if !ok {
		return nil, &ArgError{Field: field, Reason: "must be a base64 string"}
	}
	b, err := base64.StdEncoding.Strict().DecodeString(s)
	if err != nil {
		return nil, &ArgError{Field: field, Reason: "not base64 (RFC 4648 standard alphabet, padded)"}
	}
	if *budget -= len(b); *budget < 0 {
		return nil, &ArgError{Field: field, Reason: fmt.Sprintf("files are over %d bytes in total", MaxArgsBytes)}
	}
	return b, nil
}

// checkBody checks the body's strings and that the encoder can send it.
// Files are exempt from the per-string cap: MaxArgsBytes caps them.
func (t *Tool) checkBody(body any) error {
	c := t.codec
	if c == nil || c.kind == bodyJSON {
		return checkStrings(body, "body", false)
	}
	if c.kind == bodyForm {
		if err := checkStrings(body, "body", false); err != nil {
			return err
		}
		_, err := c.encodeForm(body)
		return err
	}
	_, _, err := c.encode(body)
	return err
}

// encode serialises a body for sending and returns its Content-Type.
func (c *bodyCodec) encode(body any) ([]byte, string, error) {
	switch c.kind {
	case bodyForm:
		b, err := c.encodeForm(body)
		return b, formType, err
	case bodyMultipart:
		return c.encodeMultipart(body)
	case bodyBinary:
		budget := MaxArgsBytes
		b, err := decodeBinary(body, "body", &budget)
		return b, c.contentType, err
	}
	b, err := json.Marshal(body)
	if err != nil {
		return nil, "", &ArgError{Field: "body", Reason: "cannot encode as JSON"}
	}
	return b, "application/json", nil
}

// encodeForm writes an application/x-www-form-urlencoded body. Properties
// with an encoding entry follow it; others go as OpenAPI's default (style
// form, explode: scalars as they are, arrays of scalars as repeated keys),
// except that an object with no encoding entry is sent as JSON text.
func (c *bodyCodec) encodeForm(body any) ([]byte, error) {
	obj, ok := body.(map[string]any)
	if !ok {
		return nil, &ArgError{Field: "body", Reason: "a form body must be an object"}
	}
	declared := maps.Clone(c.declared)
	for k := range obj {
		declared[k] = true
	}
	var all [][]pair
	for _, k := range sortedKeys(obj) {
		v := obj[k]
		if v == nil {
			continue
		}
		st, ok := c.form[k]
		if !ok {
			st = style{name: "form", explode: true}
			_, isObj := v.(map[string]any)
			st.json = isObj
		}
		ps, err := serialise(k, v, st, "body."+k)
		if err != nil {
			return nil, err
		}
		all = append(all, ps)
	}
	if err := checkCollisions(all, declared, "body"); err != nil {
		return nil, err
	}
	var pairs []pair
	for _, ps := range all {
		pairs = append(pairs, ps...)
	}
	return []byte(writePairs(pairs, url.QueryEscape)), nil
}

// encodeMultipart writes a multipart/form-data body: a file property as a
// file part of its decoded bytes, a scalar as a text part, and an object or
// array as a JSON part (OpenAPI 3.0.3 §4.7.14.5 defaults), in property
// order.
func (c *bodyCodec) encodeMultipart(body any) ([]byte, string, error) {
	obj, ok := body.(map[string]any)
	if !ok {
		return nil, "", &ArgError{Field: "body", Reason: "a multipart body must be an object"}
	}
	var parts []mpart
	budget := MaxArgsBytes
	for _, k := range sortedKeys(obj) {
		v, field := obj[k], "body."+k
		if v == nil || c.filenames[k] {
			continue
		}
		if !safePartName(k) {
			return nil, "", &ArgError{Field: field, Reason: "not a safe multipart part name"}
		}
		p := c.parts[k]
		if p.binary {
			filename := k
			if p.filename != "" && obj[p.filename] != nil {
				s, ok := obj[p.filename].(string)
				if !ok {
					return nil, "", &ArgError{Field: "body." + p.filename, Reason: "must be a string"}
				}
				if err := checkFilename(s, "body."+p.filename); err != nil {
					return nil, "", err
				}
				filename = s
			}
			files := []any{v}
			if arr, ok := v.([]any); ok {
				files = arr
			}
			for i, f := range files {
				sub := field
				if _, ok := v.([]any); ok {
					sub += "[" + strconv.Itoa(i) + "]"
				}
				data, err := decodeBinary(f, sub, &budget)
				if err != nil {
					return nil, "", err
				}
				parts = append(parts, mpart{k, filename, p.contentType, data})
			}
			continue
		}
		if err := checkStrings(v, field, false); err != nil {
			return nil, "", err
		}
		if isScalar(v) {
			parts = append(parts, mpart{k, "", "", []byte(scalarString(v))})
			continue
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, "", &ArgError{Field: field, Reason: "cannot encode as JSON"}
		}
		parts = append(parts, mpart{k, "", "application/json", b})
	}
	return writeMultipart(parts)
}

// mpart is one multipart part before it is written.
type mpart struct {
	name, filename, contentType string
	data                        []byte
}

// writeMultipart writes parts with a boundary derived from their content
// (SHA-256 over every field, length-prefixed), so that the same arguments
// give the same bytes: a held call's re-send and an "always allow" grant
// match on the request hash, which a random boundary would change on every
// build. A part cannot hold its own boundary short of a SHA-256 fixed
// point; it is checked anyway.
func writeMultipart(parts []mpart) ([]byte, string, error) {
	h := sha256.New()
	for _, p := range parts {
		for _, f := range [][]byte{[]byte(p.name), []byte(p.filename), []byte(p.contentType), p.data} {
			var n [8]byte
			binary.BigEndian.PutUint64(n[:], uint64(len(f)))
			h.Write(n[:])
			h.Write(f)
		}
	}
	boundary := "sluice" + hex.EncodeToString(h.Sum(nil)[:28])
	var buf bytes.Buffer
	w := multipart.NewWriter(&buf)
	if err := w.SetBoundary(boundary); err != nil {
		return nil, "", fmt.Errorf("connectors: new request: bug(): multipart boundary: %w", err)
	}
	for _, p := range parts {
		if bytes.Contains(p.data, []byte(boundary)) {
			return nil, "", &ArgError{Field: "body." + p.name, Reason: "holds the multipart boundary"}
		}
		if err := writePart(w, p.name, p.filename, p.contentType, p.data); err != nil {
			return nil, "", err
		}
	}
	if err := w.Close(); err != nil {
		return nil, "", fmt.Errorf("connectors: new request: multipart: %w", err)
	}
	return buf.Bytes(), w.FormDataContentType(), nil
}

// writePart writes one part. Its Content-Disposition is built by
// mime.FormatMediaType, which quotes the name and filename and writes one
// holding anything but printable ASCII in RFC 2231 form, so no value can end
// the header line or the quoted string.
func writePart(w *multipart.Writer, name, filename, contentType string, data []byte) error {
	params := map[string]string{"name": name}
	if filename != "" {
		params["filename"] = filename
	}
	cd := mime.FormatMediaType("form-data", params)
	if cd == "" || strings.ContainsAny(cd, "\r\n") {
		return &ArgError{Field: "body." + name, Reason: "cannot write a Content-Disposition for this part"}
	}
	h := textproto.MIMEHeader{"Content-Disposition": {cd}}
	if contentType != "" {
		h.Set("Content-Type", contentType)
	}
	pw, err := w.CreatePart(h)
	if err != nil {
		return fmt.Errorf("connectors: new request: multipart: %w", err)
	}
	if _, err := pw.Write(data); err != nil {
		return fmt.Errorf("connectors: new request: multipart: %w", err)
	}
	return nil
}
