package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"syscall"
	"time"

	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/policy"
)

// An absolute-form request's exchange with its upstream, on a connection
// of upstreamPool (egress_transport.go): the request is written with the
// standard library's framing (Request.Write, as http.Transport writes
// it), and the response head is read here, strictly. Its framing must be
// unambiguous before a byte of its body is relayed, because the
// connection carries the caller's next request: both Content-Length and
// Transfer-Encoding, more than one Content-Length, a coding other than
// chunked, a bare LF, obs-fold or a control byte in a field, and a body
// whose chunks or length do not match its framing, close the connection
// and fail the exchange (THREATS F1-F4, applied to the upstream). Go's
// ReadResponse would repair some of these (it drops Content-Length next
// to Transfer-Encoding and joins obs-fold lines), so it is not used.

// maxResponseHead bounds an upstream response head, status line included,
// as http.Transport's MaxResponseHeaderBytes did; it also bounds the
// trailer section of a chunked body, and the 1xx heads before a response.
const maxResponseHead = 64 << 10

// max1xx bounds the informational responses skipped before the final one.
const max1xx = 16

// aLongTimeAgo is a deadline in the past: it fails a blocked read or write
// at once.
var aLongTimeAgo = time.Unix(1, 0)

// upstreamFailure classifies a failed exchange for its refusal.
type upstreamFailure int

const (
	upSend       upstreamFailure = iota // the request could not be written
	upClosed                            // the connection ended before a response head
	upTimeout                           // no response head within the header timeout
	upProtocol                          // the response is malformed or its framing ambiguous
	upBodyBroken                        // the body ended before its framing did, or broke it
)

// upstreamError is a failed exchange. nothingRead says no byte of a
// response arrived, so a replayable request may be sent again on a fresh
// connection.
type upstreamError struct {
	kind        upstreamFailure
	nothingRead bool
	err         error
}

func (e *upstreamError) Error() string { return "upstream exchange: " + e.err.Error() }
func (e *upstreamError) Unwrap() error { return e.err }

// upResponse is an upstream's answer. Its body must be read to its end or
// closed; only a body read to its end returns the connection to the pool.
type upResponse struct {
	status int
	header http.Header
	body   *upBody
	remote string // the upstream's address, for the audit record
}

// roundTrip sends req (whose URL and Host name addr's host) to addr, on
// caller's idle connection to it if there is one. A replayable request
// whose reused connection turns out closed before any answer is sent
// again, on the next idle connection or a fresh one, as http.Transport
// does (each failed connection is closed; a fresh one is never retried).
func (p *upstreamPool) roundTrip(ctx context.Context, caller policy.Caller, addr string, req *http.Request) (*upResponse, error) {
	for attempt := 0; ; attempt++ {
		pc, err := p.get(ctx, caller, addr)
		if err != nil {
			return nil, err
		}
		resp, err := p.exchange(ctx, caller, pc, req)
		var ue *upstreamError
		if err != nil && pc.reused && attempt <= p.opts.maxIdlePerHost && errors.As(err, &ue) && ue.nothingRead && replayable(req) && ctx.Err() == nil {
			continue
		}
		return resp, err
	}
}

// replayable reports whether req may be sent twice: it has no body and
// its method is idempotent (RFC 9110 9.2.2), or it says it may be.
func replayable(req *http.Request) bool {
	if req.Body != nil && req.Body != http.NoBody {
		return false
	}
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	_, ok := req.Header["Idempotency-Key"]
	_, xok := req.Header["X-Idempotency-Key"]
	return ok || xok
}

// exchange writes req on pc and reads the response head. On failure pc
// is closed.
func (p *upstreamPool) exchange(ctx context.Context, caller policy.Caller, pc *upConn, req *http.Request) (*upResponse, error) {
	// A caller who goes away ends the exchange: the deadline in the past
	// fails whatever read or write is blocked, and the connection is not
	// reused (stop reports that the function ran).
	stop := context.AfterFunc(ctx, func() { _ = pc.conn.SetDeadline(aLongTimeAgo) })
	fail := func(kind upstreamFailure, nothing bool, err error) (*upResponse, error) {
		stop()
		_ = pc.conn.Close()
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (%w)", err, context.Cause(ctx))
		}
		return nil, &upstreamError{kind: kind, nothingRead: nothing, err: err}
	}
	hasBody := req.Body != nil && req.Body != http.NoBody
	to := p.opts.headerTimeout
	var werr error
	if hasBody {
		// Each write of the body must progress within the timeout; the
		// body itself comes at the caller's pace.
		w := &progressWriter{conn: pc.conn, d: to}
		pc.bw.Reset(w)
		werr = req.Write(pc.bw)
		if werr == nil {
			werr = pc.bw.Flush()
		}
		pc.bw.Reset(pc.conn)
		_ = pc.conn.SetDeadline(time.Now().Add(to))
	} else {
		_ = pc.conn.SetDeadline(time.Now().Add(to)) // the write and the response head
		werr = req.Write(pc.bw)
		if werr == nil {
			werr = pc.bw.Flush()
		}
	}
	if werr != nil && !hasBody {
		return fail(upSend, true, fmt.Errorf("write request: %w", werr))
	}
	// With a body, an upstream may answer before reading all of it and
	// close: its answer is still relayed (on a connection not reused).
	h, err := readFinalHead(pc.br, req.Method)
	if err != nil {
		switch {
		case werr != nil:
			return fail(upSend, false, fmt.Errorf("write request: %w", werr))
		case errors.Is(err, errNothingRead):
			return fail(upClosed, true, err)
		case ctx.Err() != nil: // the caller went away
			return fail(upClosed, false, err)
		case isTimeout(err):
			return fail(upTimeout, false, err)
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), isNetErr(err):
			return fail(upClosed, false, err)
		}
		return fail(upProtocol, false, err)
	}
	_ = pc.conn.SetDeadline(time.Time{})
	b := &upBody{p: p, caller: caller, pc: pc, stop: stop, mode: h.mode, remain: h.length,
		reuse: werr == nil && !h.close && !req.Close}
	if h.mode == bodyChunked {
		b.chunks = httputil.NewChunkedReader(pc.br)
	}
	if h.mode == bodyNone {
		b.finish()
	}
	return &upResponse{status: h.status, header: h.header, body: b, remote: pc.remote}, nil
}

// progressWriter sets a write deadline before each write.
type progressWriter struct {
	conn net.Conn
	d    time.Duration
}

func (w *progressWriter) Write(b []byte) (int, error) {
	_ = w.conn.SetWriteDeadline(time.Now().Add(w.d))
	return w.conn.Write(b)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func isNetErr(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe)
}

// bodyMode is a response body's framing (RFC 9112 6.3).
type bodyMode int

const (
	bodyNone    bodyMode = iota // HEAD, 1xx, 204, 304
	bodyLength                  // Content-Length
	bodyChunked                 // Transfer-Encoding: chunked
	bodyToClose                 // neither: until the upstream closes; never reused
)

// respHead is a parsed response head.
type respHead struct {
	status int
	header http.Header
	mode   bodyMode
	length int64 // bodyLength's
	close  bool  // the connection may not carry another request
}

// errNothingRead is a connection that ended before the first byte of a
// response.
var errNothingRead = errors.New("the upstream closed the connection before answering")

// readFinalHead reads response heads until one that is not 1xx.
func readFinalHead(br *bufio.Reader, method string) (*respHead, error) {
	budget := maxResponseHead
	for i := 0; ; i++ {
		h, err := readResponseHead(br, method, &budget, i == 0)
		if err != nil {
			return nil, err
		}
		switch {
		case h.status == http.StatusSwitchingProtocols:
			// Upgrade is hop-by-hop and never forwarded: nothing asked
			// for a protocol switch.
			return nil, errors.New("response head: 101 Switching Protocols that was not asked for")
		case h.status >= 200:
			return h, nil
		case i+1 >= max1xx:
			return nil, errors.New("response head: too many 1xx responses")
		}
	}
}

// readResponseHead reads one response head (RFC 9112 4, 5) off br and sets
// its body's framing (RFC 9112 6.3) for a request of method. budget is
// what is left of maxResponseHead. first says it is the first head of
// the exchange: its connection ending before any byte is errNothingRead.
func readResponseHead(br *bufio.Reader, method string, budget *int, first bool) (*respHead, error) {
	line, err := readHeadLine(br, budget)
	if err != nil {
		if first && errors.Is(err, errLineEmptyEOF) {
			return nil, errNothingRead
		}
		return nil, fmt.Errorf("response status line: %w", err)
	}
	h := &respHead{}
	major, minor, err := parseStatusLine(line, &h.status)
	if err != nil {
		return nil, err
	}
	h.header = make(http.Header, 8)
	// Values of the first fields share one backing array (each key's
	// slice is capped at its one value: a repeated field appends into
	// an array of its own), as net/textproto does.
	vals := make([]string, 0, 8)
	var cls, tes int
	var cl []byte
	te := ""
	for {
		line, err := readHeadLine(br, budget)
		if err != nil {
			return nil, fmt.Errorf("response head: %w", err)
		}
		if len(line) == 0 {
			break
		}
		if err := h1.CheckFieldLine(line); err != nil {
			return nil, fmt.Errorf("response head: %w", err)
		}
		name, value := h1.SplitField(line)
		switch h1.Name(name) {
		case h1.ContentLength:
			cls++
			cl = append(cl[:0], value...)
		case h1.TransferEncoding:
			tes++
			te = string(value)
		case h1.Connection:
			h.close = h.close || h1.HasToken(string(value), "close")
		}
		key, ok := commonResponseKeys[string(name)] // no allocation for the lookup
		if !ok {
			key = http.CanonicalHeaderKey(string(name))
		}
		if prev, seen := h.header[key]; seen || len(vals) == cap(vals) {
			h.header[key] = append(prev, string(value))
		} else {
			vals = append(vals, string(value))
			h.header[key] = vals[len(vals)-1 : len(vals) : len(vals)]
		}
	}
	if major != 1 || minor != 1 {
		h.close = true // HTTP/1.0: no reuse, whatever it says about keep-alive
	}
	switch {
	case cls > 0 && tes > 0:
		return nil, errors.New("response head: both Content-Length and Transfer-Encoding (RFC 9112 6.3)")
	case cls > 1:
		return nil, errors.New("response head: more than one Content-Length (RFC 9110 8.6)")
	case tes > 1 || tes == 1 && !strings.EqualFold(te, "chunked"):
		return nil, errors.New("response head: unsupported Transfer-Encoding (RFC 9112 6.1)")
	case tes > 0 && minor == 0:
		return nil, errors.New("response head: Transfer-Encoding in an HTTP/1.0 response (RFC 9112 6.1)")
	}
	if cls == 1 {
		n, ok := parseContentLength(cl)
		if !ok {
			return nil, errors.New("response head: bad Content-Length (RFC 9110 8.6)")
		}
		h.length = n
	}
	switch {
	case method == http.MethodHead || h.status < 200 || h.status == http.StatusNoContent || h.status == http.StatusNotModified:
		h.mode = bodyNone
	case tes == 1:
		h.mode = bodyChunked
		delete(h.header, "Content-Length")
	case cls == 1:
		h.mode = bodyLength
		if h.length == 0 {
			h.mode = bodyNone
		}
	default:
		h.mode, h.close = bodyToClose, true
	}
	return h, nil
}

// commonResponseKeys maps the canonical names of common response fields,
// spelled canonically on the wire, to themselves: such a name is used as
// the header key without allocating it again (CanonicalHeaderKey returns
// a canonical name unchanged). Any other spelling is canonicalised.
var commonResponseKeys = func() map[string]string {
	m := map[string]string{}
	for _, k := range []string{"Accept-Ranges", "Age", "Cache-Control", "Connection", "Content-Disposition", "Content-Encoding",
		"Content-Language", "Content-Length", "Content-Type", "Date", "Etag", "Expires", "Keep-Alive", "Last-Modified",
		"Location", "Server", "Set-Cookie", "Strict-Transport-Security", "Transfer-Encoding", "Vary", "Www-Authenticate", "X-Content-Type-Options"} {
		m[k] = http.CanonicalHeaderKey(k)
	}
	return m
}()

// parseStatusLine parses HTTP-version SP 3DIGIT SP [reason] (RFC 9112 4)
// and returns the version; only HTTP/1.x is accepted.
func parseStatusLine(line []byte, status *int) (major, minor int, err error) {
	bad := func(what string) (int, int, error) { return 0, 0, errors.New("response status line: " + what) }
	if len(line) < len("HTTP/1.1 200") || string(line[:7]) != "HTTP/1." || line[8] != ' ' {
		return bad("not HTTP/1.x version SP status")
	}
	if line[7] != '0' && line[7] != '1' {
		return bad("unsupported HTTP version")
	}
	code := line[9:12]
	if len(line) > 12 && line[12] != ' ' {
		return bad("status code is not three digits")
	}
	n := 0
	for _, c := range code {
		if c < '0' || c > '9' {
			return bad("status code is not three digits")
		}
		n = n*10 + int(c-'0')
	}
	if n < 100 {
		return bad("status code under 100")
	}
	for _, c := range line[min(len(line), 12):] {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return bad("control byte in the reason phrase")
		}
	}
	*status = n
	return 1, int(line[7] - '0'), nil
}

// parseContentLength parses 1*DIGIT, at most 18 digits.
func parseContentLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// errLineEmptyEOF is a connection that ended (or was reset) before the
// first byte of a line.
var errLineEmptyEOF = errors.New("the connection ended")

// readHeadLine reads one CRLF-ended line and returns it without the CRLF;
// the slice is valid until br's next read. A line over what is left of
// budget, a bare LF and the connection ending inside it are errors.
func readHeadLine(br *bufio.Reader, budget *int) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		// Longer than the reader's buffer: gathered, within the budget.
		long := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) {
			if len(long) > *budget {
				return nil, fmt.Errorf("the head is over %d bytes", maxResponseHead)
			}
			line, err = br.ReadSlice('\n')
			long = append(long, line...)
		}
		line = long
	}
	if err != nil {
		switch {
		case len(line) == 0 && (errors.Is(err, io.EOF) || errors.Is(err, syscall.ECONNRESET)):
			// The end, or a reset: the upstream had closed the
			// connection when the request reached it.
			return nil, errLineEmptyEOF
		case errors.Is(err, io.EOF):
			return nil, io.ErrUnexpectedEOF
		}
		return nil, err
	}
	if *budget -= len(line); *budget < 0 {
		return nil, fmt.Errorf("the head is over %d bytes", maxResponseHead)
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return nil, errors.New("line ends in a bare LF (RFC 9112 2.2)")
	}
	return line[:len(line)-2], nil
}

// upBody is a response body, framed as its head says. Read to its end,
// with nothing after it and a head that allows reuse, it returns the
// connection to the pool; any failure or an early Close closes it.
type upBody struct {
	p      *upstreamPool
	caller policy.Caller
	pc     *upConn
	stop   func() bool // the exchange's context.AfterFunc
	mode   bodyMode
	remain int64
	chunks io.Reader // bodyChunked's
	reuse  bool
	err    error // io.EOF at the end, an *upstreamError on failure
	done   bool  // the connection was pooled or closed
}

func (b *upBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	var n int
	var err error
	switch b.mode {
	case bodyLength:
		if int64(len(p)) > b.remain {
			p = p[:b.remain]
		}
		n, err = b.pc.br.Read(p)
		b.remain -= int64(n)
		switch {
		case b.remain == 0:
			return n, b.finish()
		case errors.Is(err, io.EOF):
			return n, b.fail(io.ErrUnexpectedEOF)
		}
	case bodyChunked:
		n, err = b.chunks.Read(p)
		if errors.Is(err, io.EOF) {
			budget := maxResponseHead
			if terr := readTrailer(b.pc.br, &budget); terr != nil {
				return n, b.fail(terr)
			}
			return n, b.finish()
		}
	case bodyToClose:
		n, err = b.pc.br.Read(p)
		if errors.Is(err, io.EOF) {
			return n, b.finish()
		}
	default:
		return 0, b.finish()
	}
	if err != nil {
		return n, b.fail(err)
	}
	return n, nil
}

// prefetch reads the start of the body into buf: at least a byte (or its
// end), and all of a Content-Length body that fits in buf. The proxy
// reads it before it commits the answer, so that a body that breaks at
// once is refused rather than relayed cut.
func (b *upBody) prefetch(buf []byte) (int, error) {
	whole := b.mode == bodyLength && b.remain <= int64(len(buf))
	n := 0
	for {
		k, err := b.Read(buf[n:])
		n += k
		if err != nil || n > 0 && !whole {
			return n, err
		}
	}
}

// readTrailer reads a chunked body's trailer section up to its empty
// line; its fields are checked and dropped (the proxy relays no trailers).
func readTrailer(br *bufio.Reader, budget *int) error {
	for {
		line, err := readHeadLine(br, budget)
		if err != nil {
			if errors.Is(err, errLineEmptyEOF) {
				err = io.ErrUnexpectedEOF
			}
			return fmt.Errorf("chunked trailer: %w", err)
		}
		if len(line) == 0 {
			return nil
		}
		if err := h1.CheckFieldLine(line); err != nil {
			return fmt.Errorf("chunked trailer: %w", err)
		}
	}
}

// finish ends a body read to its end: the connection is pooled if it may
// carry another request, and closed otherwise.
func (b *upBody) finish() error {
	b.err = io.EOF
	if b.done {
		return io.EOF
	}
	b.done = true
	// stop is false if the caller went away (the connection's deadline
	// is then in the past); bytes already buffered past the response
	// were never asked for.
	if b.stop() && b.reuse && b.pc.br.Buffered() == 0 {
		b.p.put(b.caller, b.pc)
		return io.EOF
	}
	_ = b.pc.conn.Close()
	return io.EOF
}

// fail ends a body that broke its framing or whose connection failed.
func (b *upBody) fail(err error) error {
	b.err = &upstreamError{kind: upBodyBroken, err: fmt.Errorf("response body: %w", err)}
	if !b.done {
		b.done = true
		b.stop()
		_ = b.pc.conn.Close()
	}
	return b.err
}

// errBodyClosed is a Read after Close.
var errBodyClosed = errors.New("upstream response body closed")

// Close ends the body. Before its end, the connection is closed, never
// drained: what is left of it is the upstream's, not the next request's.
func (b *upBody) Close() error {
	if !b.done {
		b.done = true
		b.err = errBodyClosed
		b.stop()
		_ = b.pc.conn.Close()
	}
	return nil
}

// failed reports whether the body broke its framing or its connection
// failed, and how.
func (b *upBody) failed() error {
	var ue *upstreamError
	if errors.As(b.err, &ue) {
		return ue
	}
	return nil
}
