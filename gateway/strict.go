package gateway

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// strictHeads wraps the sandbox listener so that every request head on a
// sandbox connection is checked, byte for byte, before Go's HTTP server
// parses it (THREATS F1-F4). Go's server already refuses much, but it
// accepts, and silently repairs, some framing a proxy must refuse: both
// Content-Length and Transfer-Encoding (it drops Content-Length), identical
// repeated Content-Length (it keeps one), obs-fold continuation lines (it
// joins them) and bare LF line ends. A refused connection gets a 400 JSON
// error and is closed: nothing of it reaches a handler, let alone an
// upstream.
type strictHeads struct{ net.Listener }

// Accept wraps the relayed connection's reader with a checker.
func (l strictHeads) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if ic, ok := c.(*identConn); ok {
		ic.r = bufio.NewReaderSize(&headChecker{src: ic.r, conn: ic.Conn}, 4096)
	}
	return c, nil
}

// maxHead bounds the head the checker keeps; Go refuses longer heads itself
// (MaxHeaderBytes), so past it the checker only keeps looking for the end.
const maxHead = 80 << 10

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
	conn   net.Conn
	state  checkState
	buf    []byte // the current head, chunk line or trailer line
	remain int64
	crlf   int // bytes of the chunk-data CRLF seen
}

// errStrict is returned to the server after the 400 was written.
var errStrict = errors.New("gateway: malformed request framing refused")

func (h *headChecker) Read(p []byte) (int, error) {
	if h.state == stFailed {
		return 0, errStrict
	}
	n, err := h.src.Read(p)
	if n > 0 && h.state != stPass {
		if ferr := h.feed(p[:n]); ferr != nil {
			h.state = stFailed
			h.reject(ferr)
			return 0, errStrict
		}
	}
	return n, err
}

// reject answers 400 directly on the connection and closes it.
func (h *headChecker) reject(why error) {
	body := fmt.Sprintf(`{"error":{"code":%q,"message":%q,"request_id":%q}}`+"\n",
		CodeSchemaViolation, "malformed HTTP framing: "+why.Error(), newRequestID())
	_ = h.conn.SetWriteDeadline(time.Now().Add(time.Second))
	fmt.Fprintf(h.conn, "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nProxy-Status: sluice; error=http_request_error\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", len(body), body)
	_ = h.conn.Close()
}

// feed advances the framing state over b.
func (h *headChecker) feed(b []byte) error {
	for len(b) > 0 && h.state != stPass {
		switch h.state {
		case stHead, stChunkLine, stTrailer:
			i := bytes.IndexByte(b, '\n')
			if i < 0 {
				h.buf = appendBounded(h.buf, b)
				return nil
			}
			h.buf = appendBounded(h.buf, b[:i+1])
			b = b[i+1:]
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
	if len(dst)+len(b) > maxHead {
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
			return nil
		}
		return checkFieldLine(l)
	}
	// stHead: wait for the empty line that ends it; a leading empty line
	// before the request line is tolerated (RFC 9112 2.2).
	if !bytes.HasSuffix(h.buf, []byte("\r\n\r\n")) && !bytes.Equal(h.buf, []byte("\r\n")) {
		return nil
	}
	head := h.buf
	h.buf = h.buf[:0]
	if bytes.Equal(head, []byte("\r\n")) {
		return nil
	}
	return h.head(head)
}

// head checks a complete request head and sets the framing of its body.
func (h *headChecker) head(head []byte) error {
	if bytes.HasPrefix(head, []byte("overflow")) {
		return nil // too long: Go's server refuses it
	}
	lines := strings.Split(strings.TrimSuffix(string(head), "\r\n\r\n"), "\r\n")
	reqLine := lines[0]
	if strings.ContainsAny(reqLine, "\r\n\x00") {
		return errors.New("bad request line")
	}
	method, _, _ := strings.Cut(reqLine, " ")
	// An Upgrade header does not end HTTP here: nothing on the sandbox
	// socket answers 101 (the forward proxy strips Upgrade as hop-by-hop),
	// so the connection stays HTTP and the next head is checked like any.
	var cls, tes []string
	for _, fl := range lines[1:] {
		if err := checkFieldLine([]byte(fl)); err != nil {
			return err
		}
		name, value, _ := strings.Cut(fl, ":")
		value = strings.Trim(value, " \t")
		switch strings.ToLower(name) {
		case "content-length":
			cls = append(cls, value)
		case "transfer-encoding":
			tes = append(tes, value)
		}
	}
	switch {
	case len(cls) > 1:
		return errors.New("more than one Content-Length (RFC 9110 8.6)")
	case len(cls) == 1 && len(tes) > 0:
		return errors.New("both Content-Length and Transfer-Encoding (RFC 9112 6.3)")
	case len(tes) > 1 || len(tes) == 1 && !strings.EqualFold(tes[0], "chunked"):
		return errors.New("unsupported Transfer-Encoding (RFC 9112 6.1)")
	}
	switch {
	case method == "CONNECT" || reqLine == "PRI * HTTP/2.0":
		// A tunnel follows (its bytes are TLS, not HTTP: they are spliced,
		// never parsed) or the server refuses and closes: every refusal of
		// a CONNECT is answered with Connection: close.
		h.state = stPass
	case len(tes) == 1:
		h.state = stChunkLine
	case len(cls) == 1:
		n, err := strconv.ParseInt(cls[0], 10, 64)
		if err != nil || n < 0 || cls[0][0] == '+' {
			return errors.New("bad Content-Length")
		}
		if n > 0 {
			h.state, h.remain = stBody, n
		}
	}
	return nil
}

// checkFieldLine refuses obs-fold, a name that is not a token (bytes
// 0x80-0xff, a space before the colon) and control bytes in a value.
func checkFieldLine(l []byte) error {
	if len(l) > 0 && (l[0] == ' ' || l[0] == '\t') {
		return errors.New("obs-fold continuation line (RFC 9112 5.2)")
	}
	i := bytes.IndexByte(l, ':')
	if i <= 0 {
		return errors.New("header line without a name")
	}
	for _, c := range l[:i] {
		if !isTokenChar(c) {
			return errors.New("invalid byte in a header name (RFC 9110 5.1)")
		}
	}
	for _, c := range l[i+1:] {
		if c < 0x20 && c != '\t' || c == 0x7f {
			return errors.New("control byte in a header value (RFC 9110 5.5)")
		}
	}
	return nil
}

func isTokenChar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}
