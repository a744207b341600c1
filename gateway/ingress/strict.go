package ingress

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// strictHeads wraps the sandbox listener so that every request head on a
// sandbox connection is checked, byte for byte, before Go's HTTP server
// parses it (THREATS F1-F4). Go's server already refuses much, but it
// accepts, and silently repairs, some framing a proxy must refuse: both
// Content-Length and Transfer-Encoding (it drops Content-Length), identical
// repeated Content-Length (it keeps one), obs-fold continuation lines (it
// joins them) and bare LF line ends. It also refuses, first, every head Go
// would refuse itself with its own text/plain answer (a request line that
// does not parse, a version other than HTTP/1.x, a missing, repeated or
// malformed Host, an Expect it does not meet, a head over MaxHeaderBytes),
// so that every refusal on the socket is sluice's JSON error. A refused
// connection gets the JSON error (400, 417, 431 or 505), a log line and a
// refusal count, and is closed: nothing of it reaches a handler, let alone
// an upstream.
type strictHeads struct{ net.Listener }

// StrictHeads wraps l, the sandbox Listener, so that every request head on
// its connections is checked before Go's HTTP server parses it.
func StrictHeads(l net.Listener) net.Listener { return strictHeads{l} }

// Accept wraps the relayed connection's reader with a checker.
func (l strictHeads) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if ic, ok := c.(*Conn); ok {
		h := &headChecker{src: ic.r, conn: ic.Conn, id: ic.id}
		if sl, ok := l.Listener.(*Listener); ok {
			h.log, h.refused, h.lim = sl.log, sl.refused, sl.lim.body
		}
		ic.r = bufio.NewReaderSize(h, 4096)
	}
	return c, nil
}

// MaxHeaderBytes bounds a request head, its request line included: a
// longer one is refused 431 by the checker. The sandbox server's
// MaxHeaderBytes is the same, and Go's server refuses only past it plus
// 4 KiB, so no head ever reaches Go's own text/plain 431.
const MaxHeaderBytes = 64 << 10

// maxLine bounds a chunk-size or trailer line the checker keeps; past it
// the line is refused when it ends.
const maxLine = 80 << 10

type checkState int

const (
	stHead      checkState = iota // reading a request head
	stBody                        // skipping remain bytes of a Content-Length body
	stChunkLine                   // reading a chunk-size line
	stChunkData                   // skipping remain bytes of chunk data
	stChunkCRLF                   // expecting the CRLF after chunk data
	stTrailer                     // reading trailer lines until an empty one
	stPass                        // after a CONNECT: tunnel bytes, no more HTTP
	stFailed
)

// headChecker follows HTTP/1.1 message framing over the bytes the server
// reads and fails the read on the first violation.
type headChecker struct {
	src    io.Reader
	conn   net.Conn // nil in tests: nothing is answered
	state  checkState
	buf    []byte // the current line
	remain int64
	crlf   int // bytes of the chunk-data CRLF seen

	head       reqHead // the head being read
	lastMethod string  // of the previous request on the connection
	leading    int     // CR and LF bytes before this head's request line

	// For the refusal's log line and count; nil in tests.
	log     *slog.Logger
	refused func(refusal.Code)
	id      wire.Identity

	// The body bound (h1.BodyLimit; zero: none). gen is odd while a body is
	// read: the watchdog's timer, on its own goroutine, checks it and got,
	// the body bytes read so far, and cuts a stalled body by setting the
	// read deadline past while a Read waits (reading).
	lim     h1.BodyLimit
	gen     atomic.Uint64
	got     atomic.Int64
	reading atomic.Bool
	cut     atomic.Bool
	overdue atomic.Bool
	timer   atomic.Pointer[time.Timer]
}

// beginBody starts the body watchdog when a head announced a body.
func (h *headChecker) beginBody() {
	if h.lim.Timeout <= 0 || h.conn == nil {
		return
	}
	gen := h.gen.Add(1) // odd: in a body
	h.got.Store(0)
	start := time.Now()
	h.arm(gen, start, h.lim.Timeout)
}

// endBody stops it when the body is complete (or the connection failed).
func (h *headChecker) endBody() {
	if h.gen.Load()%2 == 1 {
		h.gen.Add(1)
		if t := h.timer.Load(); t != nil {
			t.Stop()
		}
		if h.overdue.Swap(false) {
			// The grace deadline must not outlive the body: Go's server
			// reads in the background while the handler runs, and a
			// deadline there would cancel the request's context.
			_ = h.conn.SetReadDeadline(time.Time{})
		}
	}
}

func (h *headChecker) arm(gen uint64, start time.Time, after time.Duration) {
	h.timer.Store(time.AfterFunc(after, func() {
		if h.gen.Load() != gen {
			return // that body is complete
		}
		allowed := h.lim.Timeout
		if h.lim.MinRate > 0 {
			allowed += time.Duration(h.got.Load() / h.lim.MinRate * int64(time.Second))
		}
		if rest := time.Until(start.Add(allowed)); rest > 0 {
			h.arm(gen, start, rest)
			return
		}
		// Time is up. A Read waiting now is cut at once; if none waits
		// (the handler is busy elsewhere), the next Read gets h1.OverdueGrace
		// for bytes the sandbox has already sent.
		h.overdue.Store(true)
		if h.reading.Load() {
			h.cut.Store(true)
			_ = h.conn.SetReadDeadline(time.Unix(1, 0)) // the waiting Read returns
		}
	}))
}

// reqHead is what the checker keeps of a request head while it reads it.
type reqHead struct {
	size         int // bytes so far, request line included
	lines        int // lines so far
	method       string
	major, minor int
	cls, tes     []string
	hosts        int
	host         string
	expect       string
	expectSeen   bool
	fields       int
	preface      bool // "PRI * HTTP/2.0"
}

// errStrict is returned to the server after the refusal was written.
var errStrict = errors.New("gateway: malformed request framing refused")

// headError is a refusal with a status other than 400.
type headError struct {
	status int
	code   refusal.Code
	msg    string
}

func (e *headError) Error() string { return e.msg }

func (h *headChecker) Read(p []byte) (int, error) {
	if h.state == stFailed {
		return 0, errStrict
	}
	inBody := h.gen.Load()%2 == 1
	if inBody && h.overdue.Load() {
		_ = h.conn.SetReadDeadline(time.Now().Add(h1.OverdueGrace))
		h.cut.Store(true) // a timeout now is the body's
	}
	h.reading.Store(inBody)
	n, err := h.src.Read(p)
	h.reading.Store(false)
	if inBody {
		h.got.Add(int64(n))
		var ne net.Error
		if err != nil && h.cut.Load() && errors.As(err, &ne) && ne.Timeout() {
			h.state = stFailed
			h.endBody()
			h.reject(&headError{http.StatusRequestTimeout, refusal.RequestTimeout, fmt.Sprintf(
				"the request body did not arrive in time: %s plus a second per %d bytes (gateway.request_body_timeout, gateway.request_body_min_rate)",
				h.lim.Timeout, h.lim.MinRate)})
			return 0, errStrict
		}
	}
	if n > 0 && h.state != stPass {
		if ferr := h.feed(p[:n]); ferr != nil {
			h.state = stFailed
			h.endBody()
			h.reject(ferr)
			return 0, errStrict
		}
	}
	if errors.Is(err, io.EOF) && h.state == stHead && (h.head.lines > 0 || len(h.buf) > 0) {
		// The client ended its side inside a request head (even inside
		// its request line, which Go's server then reads as a whole
		// one): Go's server would answer its own 400. Between requests,
		// the end is just the end.
		h.state = stFailed
		h.reject(errors.New("the connection ended inside a request head"))
		return 0, errStrict
	}
	return n, err
}

// reject answers the refusal directly on the connection, logs and counts
// it, and closes the connection. Unread request bytes are drained briefly
// first (a lingering close): a socket closed with unread input may reset
// the peer, which would lose the answer.
func (h *headChecker) reject(why error) {
	status, code, msg := http.StatusBadRequest, refusal.SchemaViolation, "malformed HTTP framing: "+why.Error()
	var he *headError
	if errors.As(why, &he) {
		status, code, msg = he.status, he.code, he.msg
	}
	rid := refusal.NewRequestID()
	if h.log != nil {
		h.log.Warn("sandbox socket: refused a malformed request", "decision", "block", "reason", why.Error(),
			"status", status, "code", string(code), "sandbox", h.id.Sandbox, "agent", h.id.Agent, "session", h.id.Session, "request_id", rid)
	}
	if h.refused != nil {
		h.refused(code)
	}
	if h.conn == nil {
		return
	}
	body := fmt.Sprintf(`{"error":{"code":%q,"message":%q,"request_id":%q}}`+"\n", code, msg, rid)
	_ = h.conn.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(h.conn, "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nX-Content-Type-Options: nosniff\r\nCache-Control: no-store\r\nProxy-Status: sluice; error=http_request_error\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, http.StatusText(status), len(body), body)
	if cw, ok := h.conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
		_ = h.conn.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
		_, _ = io.Copy(io.Discard, io.LimitReader(h.src, 64<<10))
	}
	_ = h.conn.Close()
}

// feed advances the framing state over b.
func (h *headChecker) feed(b []byte) error {
	for len(b) > 0 && h.state != stPass {
		switch h.state {
		case stHead, stChunkLine, stTrailer:
			i := bytes.IndexByte(b, '\n')
			n := i + 1
			if i < 0 {
				n = len(b)
			}
			if h.state == stHead {
				if h.head.size += n; h.head.size > MaxHeaderBytes {
					return &headError{http.StatusRequestHeaderFieldsTooLarge, refusal.HeaderTooLarge,
						fmt.Sprintf("the request head is over %d bytes (RFC 6585 5)", MaxHeaderBytes)}
				}
			}
			h.buf = appendBounded(h.buf, b[:n])
			b = b[n:]
			if i < 0 {
				return nil
			}
			if err := h.line(); err != nil {
				return err
			}
		case stBody, stChunkData:
			k := int64(len(b))
			if k > h.remain {
				k = h.remain
			}
			h.remain -= k
			b = b[k:]
			if h.remain == 0 {
				if h.state == stBody {
					h.state = stHead
					h.endBody()
				} else {
					h.state, h.crlf = stChunkCRLF, 0
				}
			}
		case stChunkCRLF:
			want := "\r\n"[h.crlf]
			if b[0] != want {
				return errors.New("chunk data not followed by CRLF")
			}
			b = b[1:]
			if h.crlf++; h.crlf == 2 {
				h.state = stChunkLine
			}
		}
	}
	return nil
}

func appendBounded(dst, b []byte) []byte {
	if len(dst)+len(b) > maxLine {
		return append(dst[:0], "overflow"...) // keep scanning for the end only
	}
	return append(dst, b...)
}

// line handles one complete line (ending in LF) of a head, chunk size or trailer.
func (h *headChecker) line() error {
	l := h.buf
	if len(l) < 2 || l[len(l)-2] != '\r' {
		return errors.New("line ends in a bare LF (RFC 9112 2.2)")
	}
	l = l[:len(l)-2]
	switch h.state {
	case stChunkLine:
		h.buf = h.buf[:0]
		size, _, _ := bytes.Cut(l, []byte(";"))
		if len(size) == 0 || len(size) > 16 {
			return errors.New("bad chunk size")
		}
		n, err := strconv.ParseInt(string(size), 16, 64)
		if err != nil || n < 0 {
			return errors.New("bad chunk size")
		}
		if n == 0 {
			h.state = stTrailer
		} else {
			h.state, h.remain = stChunkData, n
		}
		return nil
	case stTrailer:
		h.buf = h.buf[:0]
		if len(l) == 0 {
			h.state = stHead
			h.endBody()
			return nil
		}
		return h1.CheckFieldLine(l)
	}
	// stHead: the request line, then field lines, each checked as it
	// ends (Go's server parses each line as soon as it has it, and must
	// never see one the checker has not), then the empty line that ends
	// the head and sets its body's framing.
	h.buf = h.buf[:0]
	hd := &h.head
	hd.lines++
	switch {
	case hd.lines == 1 && len(l) == 0:
		// An empty line before a request line (RFC 9112 2.2): Go's server
		// skips up to four CR or LF bytes after a POST only, and
		// otherwise refuses it.
		hd.lines, hd.size = 0, 0
		if h.leading += 2; h.lastMethod != http.MethodPost || h.leading > 4 {
			return errors.New("empty line before the request line (RFC 9112 2.2)")
		}
		return nil
	case hd.lines == 1:
		return hd.requestLine(string(l))
	case len(l) > 0:
		return hd.field(l)
	}
	err := h.endHead()
	h.lastMethod, h.leading, h.head = hd.method, 0, reqHead{cls: hd.cls[:0], tes: hd.tes[:0]}
	return err
}

// requestLine checks a request line as Go's server parses it (method SP
// request-target SP HTTP-version, RFC 9112 3) and refuses what it would
// refuse: a method that is not a token, a target in no request form or
// with a control byte, a version that is not HTTP/d.d, and any major
// version but 1 (505) except the HTTP/2 preface.
func (hd *reqHead) requestLine(l string) error {
	if strings.ContainsAny(l, "\r\n\x00") {
		return errors.New("bad request line")
	}
	method, rest, ok1 := strings.Cut(l, " ")
	target, proto, ok2 := strings.Cut(rest, " ")
	if !ok1 || !ok2 {
		return errors.New("request line is not method, target and version (RFC 9112 3)")
	}
	if method == "" || strings.IndexFunc(method, func(r rune) bool { return r > 0x7f || !h1.IsTokenChar(byte(r)) }) >= 0 {
		return errors.New("method is not a token (RFC 9110 9.1)")
	}
	major, minor, ok := http.ParseHTTPVersion(proto)
	if !ok {
		return errors.New("malformed HTTP version (RFC 9112 2.3)")
	}
	raw := target
	if method == http.MethodConnect && !strings.HasPrefix(target, "/") {
		raw = "http://" + target // authority-form, as Go's server reads it
	}
	if _, err := url.ParseRequestURI(raw); err != nil {
		return errors.New("malformed request target (RFC 9112 3.2)")
	}
	hd.preface = method == "PRI" && target == "*" && major == 2 && minor == 0
	if major != 1 && !hd.preface {
		return &headError{http.StatusHTTPVersionNotSupported, refusal.SchemaViolation, "only HTTP/1.0 and HTTP/1.1 are served on the sandbox socket"}
	}
	hd.method, hd.major, hd.minor = method, major, minor
	return nil
}

// field checks a field line and keeps what framing, Host and Expect need.
func (hd *reqHead) field(l []byte) error {
	if err := h1.CheckFieldLine(l); err != nil {
		return err
	}
	hd.fields++
	name, value := h1.SplitField(l)
	switch f := h1.Name(name); {
	case f == h1.ContentLength:
		hd.cls = append(hd.cls, string(value))
	case f == h1.TransferEncoding:
		hd.tes = append(hd.tes, string(value))
	case f == h1.Host:
		hd.hosts++
		hd.host = string(value)
	case f == h1.Expect && !hd.expectSeen:
		hd.expectSeen, hd.expect = true, string(value) // Go's server reads the first
	}
	return nil
}

// endHead checks a complete request head and sets the framing of its body.
func (h *headChecker) endHead() error {
	hd := &h.head
	// An Upgrade header does not end HTTP here: nothing on the sandbox
	// socket answers 101 (the forward proxy strips Upgrade as hop-by-hop),
	// so the connection stays HTTP and the next head is checked like any.
	http11 := hd.major > 1 || hd.major == 1 && hd.minor >= 1
	switch {
	case len(hd.cls) > 1:
		return errors.New("more than one Content-Length (RFC 9110 8.6)")
	case len(hd.cls) == 1 && len(hd.tes) > 0:
		return errors.New("both Content-Length and Transfer-Encoding (RFC 9112 6.3)")
	case len(hd.tes) > 1 || len(hd.tes) == 1 && !strings.EqualFold(hd.tes[0], "chunked"):
		return errors.New("unsupported Transfer-Encoding (RFC 9112 6.1)")
	case len(hd.tes) > 0 && !http11:
		// Go's server ignores it and reads no body, where this checker
		// would read a chunked one: the two would disagree on where
		// the next request starts.
		return errors.New("Transfer-Encoding in an HTTP/1.0 request (RFC 9112 6.1)")
	case hd.hosts > 1:
		return errors.New("more than one Host (RFC 9112 3.2)")
	case hd.hosts == 0 && http11 && hd.method != http.MethodConnect && !(hd.preface && hd.fields == 0):
		return errors.New("no Host in an HTTP/1.1 request (RFC 9112 3.2)")
	case hd.hosts == 1 && !h1.ValidHost(hd.host):
		return errors.New("malformed Host (RFC 9112 3.2)")
	case hd.expect != "" && !h1.HasToken(hd.expect, "100-continue"):
		return &headError{http.StatusExpectationFailed, refusal.SchemaViolation, "the only expectation served is 100-continue (RFC 9110 10.1.1)"}
	}
	switch {
	case hd.method == http.MethodConnect || hd.preface:
		// A tunnel follows (its bytes are TLS, not HTTP: they are spliced,
		// never parsed) or the server refuses and closes: every refusal of
		// a CONNECT is answered with Connection: close.
		h.state = stPass
	case len(hd.tes) == 1:
		h.state = stChunkLine
		h.beginBody()
	case len(hd.cls) == 1:
		cl := hd.cls[0]
		n, err := strconv.ParseInt(cl, 10, 64)
		if err != nil || n < 0 || cl[0] == '+' {
			return errors.New("bad Content-Length")
		}
		if n > 0 {
			h.state, h.remain = stBody, n
			h.beginBody()
		}
	}
	return nil
}
