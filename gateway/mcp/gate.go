package mcp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// JSON-RPC 2.0 error codes (section 5.1).
const (
	codeParseError     = -32700
	codeInvalidRequest = -32600
	codeMethodNotFound = -32601
	// codeSession is an implementation-defined server error: the session
	// id is not one this caller opened.
	codeSession = -32001
	// codeForbidden: the connection carries no identity.
	codeForbidden = -32003
)

// methods is the allow-list of what a client may send; anything else is
// refused here, before the SDK sees it. Notifications and requests of the
// tools feature and the lifecycle only: the door offers no resources,
// prompts, completion, logging or subscriptions.
var methods = map[string]bool{
	"initialize":                       true,
	"notifications/initialized":        true,
	"ping":                             true,
	"tools/list":                       true,
	"tools/call":                       true,
	"notifications/cancelled":          true,
	"notifications/progress":           true,
	"notifications/roots/list_changed": true,
}

// envelope is the part of a JSON-RPC message the gate checks.
type envelope struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  *string         `json:"method,omitempty"`
	Result  json.RawMessage `json:"result,omitempty"`
	Error   json.RawMessage `json:"error,omitempty"`
}

// ServeHTTP is the gate: it identifies the connection, checks that a
// session id is this caller's own, and checks a POST's message (one JSON
// object, JSON-RPC 2.0, an allowed method, within the size limit) before
// the SDK sees anything. Every refusal is a JSON-RPC error naming what was
// wrong; nothing refused reaches a handler.
func (m *Door) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id, ok := m.deps.Identify(r)
	if !ok {
		rpcError(w, http.StatusForbidden, nil, codeForbidden, "the connection carries no sandbox identity")
		return
	}
	sid := r.Header.Get("Mcp-Session-Id")
	if sid != "" {
		m.mu.Lock()
		owner, known := m.owners[sid]
		m.mu.Unlock()
		if !known || owner != id {
			// One answer for unknown and foreign ids: which sessions
			// exist is not the caller's to learn.
			m.log.Warn("mcp: session id refused", "agent", id.Agent, "sandbox", id.Sandbox, "known", known)
			rpcError(w, http.StatusNotFound, nil, codeSession, "no MCP session with this Mcp-Session-Id was opened by this sandbox; initialize a new session")
			return
		}
		if r.Method == http.MethodDelete {
			// The session ends now: the fast path stops taking its calls
			// before the SDK closes it (which refuses new calls), never
			// after, and the answer waits for the ones it runs as the
			// SDK's Close waits for its own.
			if calls := m.endFast(sid); calls != nil {
				w = &waitingWriter{ResponseWriter: w, calls: calls}
			}
		}
	}
	if r.Method == http.MethodPost {
		mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type"))
		if err != nil || mt != "application/json" {
			rpcError(w, http.StatusUnsupportedMediaType, nil, codeInvalidRequest, "Content-Type must be application/json")
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, m.deps.MaxMessageBytes+1))
		if err != nil {
			rpcError(w, http.StatusBadRequest, nil, codeParseError, "the message could not be read")
			return
		}
		if int64(len(body)) > m.deps.MaxMessageBytes {
			rpcError(w, http.StatusRequestEntityTooLarge, nil, codeInvalidRequest, fmt.Sprintf("the message is larger than %d bytes", m.deps.MaxMessageBytes))
			return
		}
		if m.serveFast(w, r, body) {
			// A tools/call in the fast path's canonical form, which
			// check would let through (parseFast is stricter).
			return
		}
		e, status, rid, code, msg := check(body)
		if code != 0 {
			rpcError(w, status, rid, code, msg)
			return
		}
		if calls := m.sessionCalls(sid); calls != nil && e.Method != nil && e.ID != nil {
			// A call the SDK serves: its id is claimed in the one set the
			// fast path's calls pass too, for as long as the SDK holds it.
			if key, ok := idKey(e.ID); ok {
				if !calls.claim(key) {
					rpcError(w, http.StatusBadRequest, e.ID, codeInvalidRequest, duplicateID(key))
					return
				}
				defer calls.release(key)
			}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
	}
	m.sdk.ServeHTTP(w, r)
	if ww, ok := w.(*waitingWriter); ok {
		// A DELETE the SDK answered without writing (net/http then
		// writes 200 after this returns): still only once the calls end.
		ww.once.Do(ww.calls.wait)
	}
}

// check reports what is wrong with one POSTed message (code 0: nothing),
// and its envelope.
func check(body []byte) (e envelope, status int, id json.RawMessage, code int, msg string) {
	body = bytes.TrimSpace(body)
	if !json.Valid(body) {
		return e, http.StatusBadRequest, nil, codeParseError, "the message is not valid JSON"
	}
	switch body[0] {
	case '[':
		return e, http.StatusBadRequest, nil, codeInvalidRequest, "JSON-RPC batches are not accepted; send one message per request"
	case '{':
	default:
		return e, http.StatusBadRequest, nil, codeInvalidRequest, "the message must be a JSON-RPC 2.0 object"
	}
	// The members are checked as written, before any decoder's leniency:
	// Go's (and the SDK's) decoders match names case-insensitively and keep
	// the last of duplicates, so "Method" or a second "method" could make
	// the gate and the SDK read different methods.
	// One pass reads the names and the envelope's values together.
	e, msg = members(body)
	if msg != "" {
		return e, http.StatusBadRequest, nil, codeInvalidRequest, msg
	}
	if e.ID != nil && !validID(e.ID) {
		return e, http.StatusBadRequest, nil, codeInvalidRequest, "id: must be a string or an integer"
	}
	if e.JSONRPC != "2.0" {
		return e, http.StatusBadRequest, e.ID, codeInvalidRequest, `jsonrpc: must be "2.0"`
	}
	if e.Method == nil {
		// A response to a request the server sent (ping).
		if e.ID == nil || (e.Result == nil) == (e.Error == nil) {
			return e, http.StatusBadRequest, e.ID, codeInvalidRequest, "a message without a method must be a response: an id and one of result or error"
		}
		return e, 0, nil, 0, ""
	}
	if !methods[*e.Method] {
		return e, http.StatusNotFound, e.ID, codeMethodNotFound, fmt.Sprintf("method %q is not offered: this server speaks initialize, ping, tools/list and tools/call", *e.Method)
	}
	return e, 0, nil, 0, ""
}

// member names a JSON-RPC 2.0 message may have, exactly as spelt.
var memberNames = map[string]bool{"jsonrpc": true, "id": true, "method": true, "params": true, "result": true, "error": true}

// members checks the top-level member names of one JSON object (each one
// of memberNames, none twice) and returns the envelope they make, as
// encoding/json would decode it (a null id or result is kept as "null",
// a null method or jsonrpc is absent), or what is wrong.
func members(body []byte) (envelope, string) {
	var e envelope
	d := json.NewDecoder(bytes.NewReader(body))
	if tok, err := d.Token(); err != nil || tok != json.Delim('{') {
		return e, "the message must be a JSON-RPC 2.0 object"
	}
	seen := map[string]bool{}
	for d.More() {
		tok, err := d.Token()
		if err != nil {
			return e, "the message is not a JSON-RPC 2.0 object"
		}
		name, _ := tok.(string)
		switch {
		case !memberNames[name]:
			return e, fmt.Sprintf("member %q: not a JSON-RPC 2.0 member (jsonrpc, id, method, params, result, error; names are case-sensitive)", name)
		case seen[name]:
			return e, fmt.Sprintf("member %q: given twice", name)
		}
		seen[name] = true
		var v json.RawMessage
		if err := d.Decode(&v); err != nil {
			return e, "the message is not a JSON-RPC 2.0 object"
		}
		switch name {
		case "id":
			e.ID = v
		case "result":
			e.Result = v
		case "error":
			e.Error = v
		case "jsonrpc", "method":
			if string(v) == "null" {
				continue
			}
			var str string
			if err := json.Unmarshal(v, &str); err != nil {
				return e, "the message is not a JSON-RPC 2.0 message: " + name + ": must be a string"
			}
			if name == "jsonrpc" {
				e.JSONRPC = str
			} else {
				e.Method = &str
			}
		}
	}
	return e, ""
}

func validID(id json.RawMessage) bool {
	var v any
	d := json.NewDecoder(bytes.NewReader(id))
	d.UseNumber()
	if d.Decode(&v) != nil {
		return false
	}
	switch x := v.(type) {
	case string:
		return true
	case json.Number:
		_, err := x.Int64()
		return err == nil
	}
	return false
}

// rpcError writes a JSON-RPC error response.
func rpcError(w http.ResponseWriter, status int, id json.RawMessage, code int, msg string) {
	if id == nil {
		id = json.RawMessage("null")
	}
	b, _ := json.Marshal(map[string]any{
		"jsonrpc": "2.0",
		"id":      id,
		"error":   map[string]any{"code": code, "message": msg},
	})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}
