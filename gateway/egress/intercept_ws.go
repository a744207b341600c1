package egress

import (
	"bufio"
	"context"
	"crypto/sha1" //nolint:gosec // RFC 6455 4.2.2 defines Sec-WebSocket-Accept with SHA-1
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/call"
	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/scrub"
)

// WebSocket inside an intercepted tunnel (RFC 6455). The upgrade request
// is one request like any other: decided by policy (its headers carry
// Upgrade: websocket), placeholders substituted in its headers toward a
// bound host, a decision record before it goes upstream. Once the upstream
// answers 101 the connection carries frames both ways until either side
// ends it or it idles out; the result record then carries the byte counts.
//
// The sandbox's frames go upstream as they came: they are masked, and a
// placeholder inside one is neither substituted nor detected. When a
// secret was substituted into the upgrade request, the upstream's frames
// are scrubbed of it: every data message is reassembled (up to
// gateway.max_response_bytes), scrubbed and sent on as one frame, and a
// control frame that carries the secret loses its payload. No extension
// may be negotiated then (the request's Sec-WebSocket-Extensions is
// removed), since a compressed message cannot be checked.

// wsGUID is RFC 6455's key suffix for Sec-WebSocket-Accept.
const wsGUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

// wsUpgrade reports whether r asks to become a WebSocket.
func wsUpgrade(h http.Header, method string) bool {
	return method == http.MethodGet && headerToken(h, "Connection", "upgrade") && headerToken(h, "Upgrade", "websocket")
}

// headerToken reports whether one of h's key values lists token.
func headerToken(h http.Header, key, token string) bool {
	for _, v := range h.Values(key) {
		if h1.HasToken(v, token) {
			return true
		}
	}
	return false
}

// checkWSHandshake checks an upgrade request's own fields (RFC 6455 4.1).
func checkWSHandshake(r *http.Request) error {
	if !r.ProtoAtLeast(1, 1) {
		return errors.New("a WebSocket upgrade needs HTTP/1.1 (RFC 6455 4.1)")
	}
	if r.ContentLength != 0 {
		return errors.New("a WebSocket upgrade carries no body (RFC 6455 4.1)")
	}
	keys := r.Header.Values("Sec-WebSocket-Key")
	if len(keys) != 1 {
		return errors.New("a WebSocket upgrade needs exactly one Sec-WebSocket-Key (RFC 6455 4.1)")
	}
	if k, err := base64.StdEncoding.DecodeString(keys[0]); err != nil || len(k) != 16 {
		return errors.New("Sec-WebSocket-Key is not 16 bytes in base64 (RFC 6455 4.1)")
	}
	if v := r.Header.Values("Sec-WebSocket-Version"); len(v) != 1 || v[0] != "13" {
		return errors.New("the only WebSocket version served is 13 (RFC 6455 4.1)")
	}
	return nil
}

// wsAccept is the Sec-WebSocket-Accept answering key.
func wsAccept(key string) string {
	h := sha1.Sum([]byte(key + wsGUID)) //nolint:gosec // see import
	return base64.StdEncoding.EncodeToString(h[:])
}

// relayWebSocket serves an upstream's 101 to an upgrade request of tunnel
// c: the answer is checked, its headers scrubbed, the sandbox's connection
// taken over from the HTTP server and both relayed until done. It owns
// resp.Body.
func (e intercepted) relayWebSocket(w http.ResponseWriter, c *egressCall, key string, resp *http.Response, scr *scrub.Scrubber, wg *sync.WaitGroup) {
	wg.Add(1) // intercept waits for this relay before its tunnel ends
	defer wg.Done()
	defer resp.Body.Close()
	up, ok := resp.Body.(io.ReadWriteCloser)
	switch {
	case key == "":
		e.upstreamFailed(w, c, "the upstream switched protocols without being asked to")
		return
	case !ok:
		e.upstreamFailed(w, c, "the upstream's switched connection cannot be written")
		return
	case !headerToken(resp.Header, "Upgrade", "websocket") || !headerToken(resp.Header, "Connection", "upgrade"):
		e.upstreamFailed(w, c, "the upstream switched to a protocol other than WebSocket")
		return
	case resp.Header.Get("Sec-WebSocket-Accept") != wsAccept(key):
		e.upstreamFailed(w, c, "the upstream's Sec-WebSocket-Accept does not answer the key (RFC 6455 4.2.2)")
		return
	case scr != nil && len(resp.Header.Values("Sec-WebSocket-Extensions")) > 0:
		e.upstreamFailed(w, c, "the upstream negotiated a WebSocket extension that was not offered, so its frames cannot be checked for the secret")
		return
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		e.upstreamFailed(w, c, "the tunnel's connection cannot be switched")
		return
	}
	stripHopByHop(resp.Header)
	reflected := scr.Header(resp.Header)
	resp.Header.Set("Connection", "Upgrade")
	resp.Header.Set("Upgrade", "websocket")
	c.Status = http.StatusSwitchingProtocols
	if reflected {
		e.d.Reflected.Add(context.Background(), 1)
		if ee := e.record(context.Background(), c, call.EventSecretReflected, nil, false); ee != nil {
			e.refuse(w, c, ee)
			return
		}
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		e.upstreamFailed(w, c, "the tunnel's connection cannot be switched")
		return
	}
	defer conn.Close()
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\n")
	_ = resp.Header.Write(brw)
	_, _ = brw.WriteString("\r\n")
	if err := brw.Flush(); err != nil {
		_ = e.record(context.Background(), c, call.EventResult, nil, false)
		e.logLine(c, nil)
		return
	}
	_ = conn.SetDeadline(time.Time{})

	act := newActivity()
	touch := act.touch
	var perr atomic.Pointer[error]
	done := make(chan struct{}, 2)
	go func() {
		defer func() { done <- struct{}{} }()
		_, _ = copyCounted(up, brw.Reader, &c.BytesUp, touch)
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		var err error
		if scr == nil {
			_, err = copyCounted(conn, up, &c.BytesDown, touch)
			return
		}
		err = copyWSScrubbed(conn, up, scr, e.d.Config.Gateway.MaxResponseBytes, &c.BytesDown, touch, func() {
			e.d.Reflected.Add(context.Background(), 1)
			_ = e.record(context.Background(), c, call.EventSecretReflected, nil, false)
		})
		if errors.Is(err, errWSProtocol) {
			perr.Store(&err)
		}
	}()
	// Either side's end ends both: a WebSocket's closing handshake is
	// over once one side closes its connection.
	awaitRelay(done, e.idle, func() bool { return act.idleFor(e.idle) }, func() { conn.Close(); up.Close() }, true)
	var ee *egressError
	if p := perr.Load(); p != nil {
		ee = egressRefuse(http.StatusBadGateway, refusal.UpstreamError, psConnect, "the upstream broke the WebSocket protocol; the connection was closed")
		ee.Wrap(*p)
	}
	var ref *refusal.Error
	if ee != nil {
		ref = ee.Error
	}
	_ = e.record(context.Background(), c, call.EventResult, ref, false)
	e.logLine(c, ee)
}

// errWSProtocol marks an upstream that broke RFC 6455's framing.
var errWSProtocol = errors.New("websocket framing")

// WebSocket opcodes (RFC 6455 5.2).
const (
	wsContinuation = 0x0
	wsText         = 0x1
	wsBinary       = 0x2
	wsClose        = 0x8
	wsPing         = 0x9
	wsPong         = 0xA
)

// copyWSScrubbed relays a server's frames from src to dst with scr's
// secrets removed: each data message whole (at most limit bytes), as one
// frame; a control frame whose payload carries a secret is sent without
// it (a close keeps its status code). reflected is called for each
// message or frame a secret was removed from. It ends at src's end or
// error, a write error, or a framing error (wrapping errWSProtocol),
// adding what it wrote to n.
func copyWSScrubbed(dst io.Writer, src io.Reader, scr *scrub.Scrubber, limit int64, n *atomic.Int64, touch func(), reflected func()) error {
	br := bufio.NewReaderSize(src, 32<<10)
	bw := bufio.NewWriterSize(dst, 32<<10)
	var msg []byte
	msgOp := -1 // the opcode of the message being assembled, -1 between messages
	emit := func(op byte, payload []byte) error {
		var hdr [10]byte
		hdr[0] = 0x80 | op
		h := 2
		switch l := len(payload); {
		case l < 126:
			hdr[1] = byte(l)
		case l <= 0xFFFF:
			hdr[1] = 126
			binary.BigEndian.PutUint16(hdr[2:], uint16(l))
			h = 4
		default:
			hdr[1] = 127
			binary.BigEndian.PutUint64(hdr[2:], uint64(l))
			h = 10
		}
		_, _ = bw.Write(hdr[:h])
		_, _ = bw.Write(payload)
		if err := bw.Flush(); err != nil {
			return err
		}
		n.Add(int64(h + len(payload)))
		return nil
	}
	for {
		op, fin, payload, err := readWSFrame(br, limit-int64(len(msg)))
		if err != nil {
			if err == io.EOF && msgOp < 0 {
				return nil
			}
			return err
		}
		touch()
		if op >= wsClose {
			if out, hit := scr.Bytes(payload); hit || len(out) != len(payload) {
				reflected()
				payload = nil
				if op == wsClose && len(out) >= 2 {
					payload = out[:2] // the status code; the reason carried the secret
				}
			}
			if err := emit(op, payload); err != nil {
				return err
			}
			continue
		}
		switch {
		case op == wsContinuation && msgOp < 0:
			return fmt.Errorf("%w: a continuation frame outside a message (RFC 6455 5.4)", errWSProtocol)
		case op != wsContinuation && msgOp >= 0:
			return fmt.Errorf("%w: a new message inside a fragmented one (RFC 6455 5.4)", errWSProtocol)
		case op != wsContinuation:
			msgOp = int(op)
		}
		msg = append(msg, payload...)
		if !fin {
			continue
		}
		out, hit := scr.Bytes(msg)
		if hit {
			reflected()
		}
		if err := emit(byte(msgOp), out); err != nil {
			return err
		}
		msg, msgOp = msg[:0], -1
	}
}

// readWSFrame reads one unmasked frame: a data frame of at most room
// payload bytes, a control frame of at most 125. Reserved bits, masked or oversized frames and
// unknown opcodes are framing errors; io.EOF only before a frame's first
// byte.
func readWSFrame(br *bufio.Reader, room int64) (op byte, fin bool, payload []byte, err error) {
	var h [2]byte
	if _, err := io.ReadFull(br, h[:]); err != nil {
		if err == io.ErrUnexpectedEOF {
			err = fmt.Errorf("%w: the connection ended inside a frame", errWSProtocol)
		}
		return 0, false, nil, err
	}
	fin, op = h[0]&0x80 != 0, h[0]&0x0F
	if h[0]&0x70 != 0 {
		return 0, false, nil, fmt.Errorf("%w: reserved bits set with no extension negotiated (RFC 6455 5.2)", errWSProtocol)
	}
	if h[1]&0x80 != 0 {
		return 0, false, nil, fmt.Errorf("%w: a masked frame from the server (RFC 6455 5.1)", errWSProtocol)
	}
	switch op {
	case wsContinuation, wsText, wsBinary:
	case wsClose, wsPing, wsPong:
		if !fin || h[1]&0x7F > 125 {
			return 0, false, nil, fmt.Errorf("%w: a fragmented or oversized control frame (RFC 6455 5.5)", errWSProtocol)
		}
	default:
		return 0, false, nil, fmt.Errorf("%w: unknown opcode %#x (RFC 6455 5.2)", errWSProtocol, op)
	}
	size := uint64(h[1] & 0x7F)
	switch size {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, false, nil, fmt.Errorf("%w: the connection ended inside a frame", errWSProtocol)
		}
		size = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(br, b[:]); err != nil {
			return 0, false, nil, fmt.Errorf("%w: the connection ended inside a frame", errWSProtocol)
		}
		size = binary.BigEndian.Uint64(b[:])
		if size>>63 != 0 {
			return 0, false, nil, fmt.Errorf("%w: a frame length with its top bit set (RFC 6455 5.2)", errWSProtocol)
		}
	}
	if op < wsClose && (room < 0 || size > uint64(room)) {
		return 0, false, nil, fmt.Errorf("%w: a message over %d bytes cannot be checked for the secret", errWSProtocol, max(room, 0))
	}
	payload = make([]byte, size)
	if _, err := io.ReadFull(br, payload); err != nil {
		return 0, false, nil, fmt.Errorf("%w: the connection ended inside a frame", errWSProtocol)
	}
	return op, fin, payload, nil
}

// wsUpgradeHeaders readies the headers of an upgrade request for the
// upstream: the upgrade itself (removed with the hop-by-hop fields) and,
// when a secret was substituted, no extension offer.
func wsUpgradeHeaders(h http.Header, substituted bool) {
	h.Set("Connection", "Upgrade")
	h.Set("Upgrade", "websocket")
	if substituted {
		h.Del("Sec-WebSocket-Extensions")
	}
}

// wsKey is the upgrade request's key, "" for a request that is not one.
func wsKey(r *http.Request) string {
	if !wsUpgrade(r.Header, r.Method) {
		return ""
	}
	return strings.TrimSpace(r.Header.Get("Sec-WebSocket-Key"))
}
