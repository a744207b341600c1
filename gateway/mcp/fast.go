package mcp

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// The fast path serves the one message an agent sends most, a tools/call
// on a session it has initialized, without the SDK's session machinery
// (its JSON-RPC connection, stream bookkeeping and SSE framing, on the
// server and, because the answer is application/json, on the client).
//
// It is a strict subset of what the SDK serves: it takes a message only
// when everything about it is in a narrow, canonical form that the SDK
// would accept as the same call (the session, the negotiated protocol
// version, the headers, the JSON-RPC shape, the tool's name), and declines
// everything else, which then goes to the SDK exactly as before. A
// declined message is therefore never answered differently; a taken one
// runs the same runCall as the SDK's tool handler would. TestFastPathAsSDK
// and FuzzFastPathAsSDK check the subset against the SDK itself.
//
// What stays on the SDK: initialize, ping, tools/list, notifications and
// responses, batches, GET (SSE) and DELETE, sluice.await_hold, a call of a
// tool the caller does not list, and any call that asks for progress
// (a _meta member): progress notifications need the SDK's stream.

// fastSession is what the fast path knows of one SDK session: it exists
// from the moment the session's initialize succeeded until the session
// ends (ServerSession.Wait returns, or a DELETE of it began).
type fastSession struct {
	c       *caller
	version string // the protocol version the initialize result negotiated (Door.mu)
	// calls are the session's calls in flight on either path (inflight.go).
	calls *inflight
}

// noteInitialize records a session whose initialize the SDK answered, so
// that the fast path may take its tools/calls, and forgets it when the
// session ends.
func (m *Door) noteInitialize(c *caller, ss *sdk.ServerSession, res *sdk.InitializeResult) {
	sid := ss.ID()
	if sid == "" || res == nil {
		return
	}
	m.mu.Lock()
	fs, again := m.fastSessions[sid]
	if again {
		// A second initialize on the session: its version is the newest
		// result's, and its watcher runs already.
		fs.version = res.ProtocolVersion
		m.mu.Unlock()
		return
	}
	fs = &fastSession{c: c, version: res.ProtocolVersion, calls: newInflight()}
	m.fastSessions[sid] = fs
	m.mu.Unlock()
	go func() {
		_ = ss.Wait()
		m.mu.Lock()
		if m.fastSessions[sid] == fs {
			delete(m.fastSessions, sid)
		}
		m.mu.Unlock()
		fs.calls.end()
	}()
}

// endFast stops the fast path taking sid's calls and returns the set of
// them (nil: none was taken), for the DELETE to wait for.
func (m *Door) endFast(sid string) *inflight {
	m.mu.Lock()
	fs := m.fastSessions[sid]
	delete(m.fastSessions, sid)
	m.mu.Unlock()
	if fs == nil {
		return nil
	}
	fs.calls.end()
	return fs.calls
}

// sessionCalls is sid's set of calls in flight, nil before its
// initialize succeeded or once it ended.
func (m *Door) sessionCalls(sid string) *inflight {
	m.mu.Lock()
	defer m.mu.Unlock()
	if fs := m.fastSessions[sid]; fs != nil {
		return fs.calls
	}
	return nil
}

// fastMsg is a tools/call the fast path takes.
type fastMsg struct {
	strID string // the id, when it is a string
	intID int64  // the id, when it is an integer
	isStr bool
	name  string
	args  json.RawMessage
}

// serveFast serves r as a fast tools/call and reports true, or reports
// false having written nothing (the SDK serves it). body is the message
// the gate checked; the gate has identified the connection and checked
// that the session id is this caller's own.
func (m *Door) serveFast(w http.ResponseWriter, r *http.Request, body []byte) bool {
	if m.noFast || r.Method != http.MethodPost {
		return false
	}
	sids := r.Header.Values("Mcp-Session-Id")
	if len(sids) != 1 {
		return false
	}
	m.mu.Lock()
	fs := m.fastSessions[sids[0]]
	var version string
	if fs != nil {
		version = fs.version
	}
	m.mu.Unlock()
	if fs == nil || !fastHeaders(r, version) {
		return false
	}
	msg, ok := parseFast(body)
	if !ok {
		return false
	}
	name := msg.name
	if listed, ok := (*fs.c.names.Load())[name]; ok {
		name = listed
	}
	typed, ok := (*fs.c.fast.Load())[name]
	if !ok {
		return false // await_hold, or a tool this caller does not list
	}
	key := msg.key()
	dup, ended := fs.calls.beginFast(key)
	if ended {
		return false // a DELETE of the session began: the SDK refuses the call
	}
	if dup {
		// As the SDK answers a second call with an id in flight, on
		// either path.
		rpcError(w, http.StatusBadRequest, msg.rawID(), codeInvalidRequest, duplicateID(key))
		return true
	}
	defer fs.calls.endFast(key)
	m.fastCalls.Add(1)
	res := m.runCall(r.Context(), fs.c.id, name, typed, msg.args, "", nil) // the fast path takes no _meta, so no traceparent
	h := w.Header()
	h.Set("Cache-Control", "no-cache, no-transform")
	if fs.calls.isEnded() {
		// The session was deleted while the call ran (the DELETE waits
		// for it): the SDK delivers no result of a call it ran then, an
		// empty event stream; nor does the fast path. The call is
		// audited as any other.
		h.Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		return true
	}
	var buf bytes.Buffer
	buf.Grow(512)
	buf.WriteString(`{"jsonrpc":"2.0","id":`)
	buf.Write(msg.rawID())
	buf.WriteString(`,"result":`)
	if err := appendResult(&buf, res); err != nil {
		// The call ran: say so, as a JSON-RPC error for this id.
		m.log.Error("mcp: bug: a tool result could not be encoded", "tool", name, "err", err)
		rpcError(w, http.StatusInternalServerError, msg.rawID(), -32603, "bug: the tool result could not be encoded")
		return true
	}
	buf.WriteByte('}')
	h.Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(buf.Bytes())
	return true
}

// key is the id as the SDK's jsonrpc reads it (idKey): an integer id is
// at most 2^53, exact as a float64.
func (msg fastMsg) key() any {
	if msg.isStr {
		return msg.strID
	}
	return msg.intID
}

// rawID is the id as the SDK writes it back.
func (msg fastMsg) rawID() json.RawMessage {
	if msg.isStr {
		return json.RawMessage(`"` + msg.strID + `"`)
	}
	return json.RawMessage(strconv.FormatInt(msg.intID, 10))
}

// fastHeaders reports whether r's headers are ones the SDK accepts for a
// POST on an existing session of protocol version, in the narrow form the
// fast path takes: exactly one Mcp-Protocol-Version, equal to what the
// session negotiated and older than the sessionless protocol (2026-07-28,
// which a stateful server refuses); no other Mcp-* header than the session
// id (the standard headers Mcp-Method, Mcp-Name and Mcp-Param-* are the
// SDK's to check); no Last-Event-ID; an Accept naming both
// application/json and text/event-stream; and the SDK's DNS-rebinding
// rule for a loopback TCP listener. The gate has checked Content-Type.
func fastHeaders(r *http.Request, version string) bool {
	pv := r.Header.Values("Mcp-Protocol-Version")
	if len(pv) != 1 || pv[0] != version || version >= "2026-07-28" || !slices.Contains(sdk.SupportedProtocolVersions(), version) {
		return false
	}
	for k := range r.Header {
		if k == "Last-Event-Id" {
			return false
		}
		if strings.HasPrefix(k, "Mcp-") && k != "Mcp-Session-Id" && k != "Mcp-Protocol-Version" {
			return false
		}
	}
	var jsonOK, streamOK bool
	for _, v := range r.Header.Values("Accept") {
		for _, tok := range strings.Split(v, ",") {
			base, _, _ := strings.Cut(tok, ";")
			switch strings.ToLower(strings.TrimSpace(base)) {
			case "application/json":
				jsonOK = true
			case "text/event-stream":
				streamOK = true
			}
		}
	}
	if !jsonOK || !streamOK {
		return false
	}
	// The SDK refuses a request that came to a loopback TCP address with
	// a Host that is not loopback; take only what it lets through. The
	// sandbox socket is a Unix socket.
	la, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
	switch a := la.(type) {
	case nil, *net.UnixAddr:
		return true
	case *net.TCPAddr:
		if !a.IP.IsLoopback() {
			return true
		}
		return loopbackHost(r.Host)
	}
	return false
}

// loopbackHost reports whether host (a Host header) names a loopback
// address: localhost or a loopback IP, with or without a port.
func loopbackHost(host string) bool {
	h, _, err := net.SplitHostPort(host)
	if err != nil {
		h = strings.Trim(host, "[]")
	}
	if h == "localhost" {
		return true
	}
	ip, err := netip.ParseAddr(h)
	return err == nil && ip.IsLoopback() && ip.Zone() == ""
}

// parseFast reads body as a tools/call in the canonical form the fast
// path takes, or reports false: one object with exactly the members
// jsonrpc ("2.0"), id, method ("tools/call") and params, each once and
// spelt exactly; an id that is a string of plain characters (no escapes)
// or an integer that a float64 holds exactly (the SDK reads ids as
// float64); params with name (a plain tool name) and, optionally,
// arguments (an object), and nothing else — no _meta, so no progress
// token. What it takes, the gate's check lets through.
func parseFast(body []byte) (fastMsg, bool) {
	var msg fastMsg
	if !json.Valid(body) {
		return msg, false
	}
	var seen [4]bool
	ok := eachMember(body, func(key, raw []byte) bool {
		i := -1
		switch string(key) {
		case "jsonrpc":
			i = 0
			if string(raw) != `"2.0"` {
				return false
			}
		case "method":
			i = 1
			if string(raw) != `"tools/call"` {
				return false
			}
		case "id":
			i = 2
			if !msg.setID(raw) {
				return false
			}
		case "params":
			i = 3
			if !msg.setParams(raw) {
				return false
			}
		}
		if i < 0 || seen[i] {
			return false
		}
		seen[i] = true
		return true
	})
	return msg, ok && seen == [4]bool{true, true, true, true}
}

// eachMember calls f with each member of obj, one JSON object that
// json.Valid accepted (and nothing else but whitespace), in order: the
// member's name as written between its quotes (escapes not decoded, so an
// escaped name is never one the fast path knows) and its value as written.
// It stops and reports false when f does, or when obj is not an object.
// One pass, no decoder: the fast path's parse was half of its own cost.
func eachMember(obj []byte, f func(key, val []byte) bool) bool {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return false
	}
	i = skipSpace(obj, i+1)
	if i < len(obj) && obj[i] == '}' {
		return skipSpace(obj, i+1) == len(obj)
	}
	for i < len(obj) && obj[i] == '"' {
		kend := valueEnd(obj, i)
		key := obj[i+1 : kend-1]
		i = skipSpace(obj, kend)
		if i >= len(obj) || obj[i] != ':' {
			return false
		}
		i = skipSpace(obj, i+1)
		vend := valueEnd(obj, i)
		if vend <= i || !f(key, obj[i:vend]) {
			return false
		}
		i = skipSpace(obj, vend)
		if i < len(obj) && obj[i] == ',' {
			i = skipSpace(obj, i+1)
			continue
		}
		return i < len(obj) && obj[i] == '}' && skipSpace(obj, i+1) == len(obj)
	}
	return false
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// valueEnd is the index just past the JSON value that starts at b[i], in
// a document json.Valid accepted (len(b) if it runs off the end).
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		for j := i + 1; j < len(b); j++ {
			switch b[j] {
			case '\\':
				j++
			case '"':
				return j + 1
			}
		}
		return len(b)
	case '{', '[':
		depth := 0
		for j := i; j < len(b); j++ {
			switch b[j] {
			case '"':
				j = valueEnd(b, j) - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return len(b)
	}
	j := i
	for j < len(b) && b[j] != ',' && b[j] != '}' && b[j] != ']' && b[j] != ' ' && b[j] != '\t' && b[j] != '\n' && b[j] != '\r' {
		j++
	}
	return j
}

// maxExactID bounds an integer id: every integer up to 2^53 is exact as
// a float64.
const maxExactID = 1 << 53

func (msg *fastMsg) setID(raw json.RawMessage) bool {
	if s, ok := plainString(raw, 128); ok {
		msg.strID, msg.isStr = s, true
		return true
	}
	s := string(raw)
	if s == "" || s == "-0" || (len(s) > 1 && s[0] == '0') || (len(s) > 2 && s[:2] == "-0") {
		return false
	}
	for i, c := range s {
		if !(c >= '0' && c <= '9' || c == '-' && i == 0) {
			return false
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > maxExactID || n < -maxExactID {
		return false
	}
	msg.intID = n
	return true
}

func (msg *fastMsg) setParams(raw json.RawMessage) bool {
	var haveName, haveArgs bool
	ok := eachMember(raw, func(key, v []byte) bool {
		switch string(key) {
		case "name":
			name, ok := plainString(v, 256)
			if haveName || !ok || !toolName(name) {
				return false
			}
			msg.name, haveName = name, true
		case "arguments":
			if haveArgs || len(v) == 0 || v[0] != '{' {
				return false
			}
			msg.args, haveArgs = v, true
		default:
			return false
		}
		return true
	})
	return ok && haveName
}

// plainString reads raw as a JSON string of at most max printable ASCII
// characters with no escapes, the form whose every decoder reads the same
// and whose every encoder writes back the same.
func plainString(raw json.RawMessage, max int) (string, bool) {
	if len(raw) < 3 || len(raw) > max+2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	s := raw[1 : len(raw)-1]
	for _, c := range s {
		// No quote, backslash, or HTML characters (&, <, >): encoders
		// differ on escaping those.
		if c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '&' || c == '<' || c == '>' {
			return "", false
		}
	}
	return string(s), true
}

// toolName: the characters of a tool name or alias.
func toolName(s string) bool {
	for _, c := range s {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return s != ""
}

// FastCalls is how many tools/calls the fast path has served.
func (m *Door) FastCalls() int64 { return m.fastCalls.Load() }

// appendResult writes res as the SDK writes a tools/call result. The
// door's own results (one text, structuredContent as JSON, isError) are
// written directly; any other (a remote server's) goes through the SDK's
// encoder.
func appendResult(buf *bytes.Buffer, res *sdk.CallToolResult) error {
	text, ok := plainResult(res)
	if !ok {
		if res.Content == nil {
			res.Content = []sdk.Content{} // as the SDK writes it: never null
		}
		b, err := json.Marshal(res)
		buf.Write(b)
		return err
	}
	buf.WriteString(`{"content":[{"type":"text","text":`)
	if err := appendString(buf, text); err != nil {
		return err
	}
	buf.WriteString(`}]`)
	if res.StructuredContent != nil {
		buf.WriteString(`,"structuredContent":`)
		raw, ok := res.StructuredContent.(json.RawMessage)
		if !ok {
			var err error
			if raw, err = json.Marshal(res.StructuredContent); err != nil {
				return err
			}
		} else if !json.Valid(raw) {
			return errors.New("structuredContent is not JSON")
		}
		buf.Write(raw)
	}
	if res.IsError {
		buf.WriteString(`,"isError":true`)
	}
	buf.WriteByte('}')
	return nil
}

// plainResult returns the one text of a result that has nothing but that
// text, structuredContent and isError.
func plainResult(res *sdk.CallToolResult) (string, bool) {
	if len(res.Content) != 1 || res.Meta != nil || res.InputRequests != nil || res.RequestState != "" || res.NeedsInput() {
		return "", false
	}
	tc, ok := res.Content[0].(*sdk.TextContent)
	if !ok || tc.Meta != nil || tc.Annotations != nil {
		return "", false
	}
	return tc.Text, true
}

// appendString writes s as a JSON string as encoding/json does (HTML
// characters escaped too); a string with any byte outside ASCII goes
// through encoding/json itself (its UTF-8 rules).
func appendString(buf *bytes.Buffer, s string) error {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x7f {
			b, err := json.Marshal(s)
			buf.Write(b)
			return err
		}
	}
	const hex = "0123456789abcdef"
	buf.WriteByte('"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' && c != '<' && c != '>' && c != '&' {
			continue
		}
		buf.WriteString(s[start:i])
		switch c {
		case '"', '\\':
			buf.WriteByte('\\')
			buf.WriteByte(c)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		default:
			buf.WriteString(`\u00`)
			buf.WriteByte(hex[c>>4])
			buf.WriteByte(hex[c&0xf])
		}
		start = i + 1
	}
	buf.WriteString(s[start:])
	buf.WriteByte('"')
	return nil
}
