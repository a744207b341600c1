package wire

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// HandoffPrefix starts the handoff line. A relay that sends it passes the
// sandbox's accepted connection itself, as one SCM_RIGHTS descriptor sent in
// the same sendmsg as the line, instead of copying the connection's bytes:
// the gateway then reads and writes the sandbox's socket directly. The JSON
// object after the prefix follows exactly the identity line's rules.
//
// The Unix connection that carried the handoff (the lease) stays open while
// the gateway serves the passed connection. The gateway closes it when done,
// which is how the relay learns the connection is over; the relay closes it
// (after shutting the passed socket down) to end the connection early.
const HandoffPrefix = "SLUICE-HANDOFF "

// ErrHandoff classifies a refused handoff: the descriptors that came with
// the line do not match it (none, several, or any with an identity line) or
// the one passed is not a connected stream socket. Every descriptor
// received has been closed.
var ErrHandoff = errors.New("wire: handoff refused")

// maxRecvFDs sizes the control buffer: more than one descriptor is refused,
// but a few must fit so that they are received (and closed) rather than
// silently truncated. The kernel drops any that do not fit (MSG_CTRUNC).
const maxRecvFDs = 8

// EncodeHandoff returns the handoff line for id, newline included.
func EncodeHandoff(id Identity) ([]byte, error) { return encode(id, HandoffPrefix) }

// Handoff connects to the gateway's sandbox socket at path and passes conn
// to it: the handoff line and conn's descriptor leave in one sendmsg, so
// the gateway never sees one without the other. The returned lease is the
// Unix connection that carried them; see HandoffPrefix for its meaning.
// The caller keeps conn (its own copy of the descriptor) and must close
// it, after the lease, itself. ctx bounds the connect and the send.
func Handoff(ctx context.Context, path string, id Identity, conn syscall.Conn) (*net.UnixConn, error) {
	line, err := EncodeHandoff(id)
	if err != nil {
		return nil, err
	}
	raw, err := conn.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("wire: handoff: %w", err)
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("wire: dial %s: %w", path, err)
	}
	uc := c.(*net.UnixConn)
	if dl, ok := ctx.Deadline(); ok {
		_ = uc.SetWriteDeadline(dl)
	}
	var n int
	var werr error
	if cerr := raw.Control(func(fd uintptr) {
		n, _, werr = uc.WriteMsgUnix(line, unix.UnixRights(int(fd)), nil)
	}); cerr != nil {
		werr = cerr
	}
	if werr == nil && n < len(line) {
		// The descriptor rode with the first byte; the rest is plain data.
		_, werr = uc.Write(line[n:])
	}
	if werr != nil {
		uc.Close()
		return nil, fmt.Errorf("wire: handoff: send: %w", werr)
	}
	_ = uc.SetWriteDeadline(time.Time{})
	return uc, nil
}

// Preamble is what Receive read at the start of a gateway connection.
type Preamble struct {
	Identity Identity
	// Conn is the passed connection of a handoff (a *net.TCPConn or a
	// *net.UnixConn), nil for an identity line. The caller owns it.
	Conn net.Conn
	// Reader holds the relayed stream after an identity line (nil for a
	// handoff, whose lease carries nothing after the line).
	Reader *bufio.Reader
}

// Receive reads the line that starts a connection accepted on the
// gateway's socket, either form, with recvmsg and room for control
// messages: a plain read would discard a passed descriptor. It never reads
// more than MaxLine bytes for the line and applies the same strict parsing
// to both prefixes. A handoff must carry exactly one descriptor, a
// connected stream socket (TCP over IPv4 or IPv6, or Unix), and nothing
// after its newline; an identity line must carry none. On error every
// received descriptor is closed and c must be closed by the caller; c's
// read deadline bounds the whole read.
func Receive(c *net.UnixConn) (p Preamble, err error) {
	var fds []int
	defer func() {
		if err != nil {
			for _, fd := range fds {
				_ = unix.Close(fd)
			}
		}
	}()
	buf := make([]byte, MaxLine)
	oob := make([]byte, unix.CmsgSpace(maxRecvFDs*4))
	n := 0
	var line, rest []byte
	for line == nil {
		if n == len(buf) {
			return Preamble{}, fmt.Errorf("%w (limit %d bytes)", ErrTooLong, MaxLine)
		}
		k, oobn, flags, _, rerr := c.ReadMsgUnix(buf[n:], oob)
		k, oobn = max(k, 0), max(oobn, 0) // a failed recvmsg may report -1
		if k == 0 && rerr == nil {
			rerr = io.EOF // recvmsg reports a stream's end as 0 bytes, not io.EOF
		}
		if oobn > 0 {
			got, perr := rights(oob[:oobn])
			fds = append(fds, got...)
			if perr != nil {
				return Preamble{}, perr
			}
		}
		if flags&unix.MSG_CTRUNC != 0 {
			// More descriptors than fit, or none could be installed
			// (EMFILE): the kernel dropped them.
			return Preamble{}, fmt.Errorf("%w: control data truncated: descriptors dropped (more than %d sent, or none free)", ErrHandoff, maxRecvFDs)
		}
		start := n
		n += k
		if i := bytes.IndexByte(buf[start:n], '\n'); i >= 0 {
			line, rest = buf[:start+i], buf[start+i+1:n]
		} else if !prefixSoFar(buf[:n]) {
			// Fail fast on what is not a preamble (an HTTP request line).
			return Preamble{}, ErrMissingPrefix
		}
		if line == nil && rerr != nil {
			if errors.Is(rerr, io.EOF) {
				if n == 0 {
					return Preamble{}, fmt.Errorf("wire: read preamble: %w", io.ErrUnexpectedEOF)
				}
				return Preamble{}, ErrNoNewline
			}
			return Preamble{}, fmt.Errorf("wire: read preamble: %w", rerr)
		}
	}
	if bytes.HasPrefix(line, []byte(HandoffPrefix)) {
		id, err := parseLine(line, HandoffPrefix)
		if err != nil {
			return Preamble{}, err
		}
		if len(fds) != 1 {
			return Preamble{}, fmt.Errorf("%w: the line carried %d descriptors, want 1", ErrHandoff, len(fds))
		}
		if len(rest) != 0 {
			return Preamble{}, fmt.Errorf("%w: %d bytes after the handoff line", ErrHandoff, len(rest))
		}
		sc, err := streamConn(fds[0])
		fds = nil // streamConn owns the descriptor, also on error
		if err != nil {
			return Preamble{}, err
		}
		return Preamble{Identity: id, Conn: sc}, nil
	}
	id, err := parseLine(line, Prefix)
	if err != nil {
		return Preamble{}, err
	}
	if len(fds) != 0 {
		return Preamble{}, fmt.Errorf("%w: an identity line carried %d descriptors", ErrHandoff, len(fds))
	}
	var r io.Reader = c
	if len(rest) > 0 {
		r = io.MultiReader(bytes.NewReader(bytes.Clone(rest)), c)
	}
	return Preamble{Identity: id, Reader: bufio.NewReaderSize(r, MaxLine)}, nil
}

// prefixSoFar reports whether b could still become either preamble line.
func prefixSoFar(b []byte) bool {
	for _, p := range []string{Prefix, HandoffPrefix} {
		m := min(len(b), len(p))
		if string(b[:m]) == p[:m] {
			return true
		}
	}
	return false
}

// rights returns every descriptor passed in the control messages oob; it
// returns those it found even with an error, so the caller closes them.
func rights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %w", ErrHandoff, err)
	}
	var fds []int
	var bad error
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			bad = fmt.Errorf("%w: unexpected control message level %d type %d", ErrHandoff, m.Header.Level, m.Header.Type)
			continue
		}
		got, err := unix.ParseUnixRights(&m)
		if err != nil {
			bad = fmt.Errorf("%w: rights: %w", ErrHandoff, err)
			continue
		}
		fds = append(fds, got...)
	}
	return fds, bad
}

// streamConn turns a received descriptor into a net.Conn if it is a
// connected stream socket of a family the relay hands off; it always
// closes fd itself (net.FileConn works on a duplicate).
func streamConn(fd int) (net.Conn, error) {
	f := os.NewFile(uintptr(fd), "handoff")
	defer f.Close()
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return nil, fmt.Errorf("%w: not a socket: %w", ErrHandoff, err)
	}
	if typ != unix.SOCK_STREAM {
		return nil, fmt.Errorf("%w: socket type %d, want a stream socket", ErrHandoff, typ)
	}
	dom, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return nil, fmt.Errorf("%w: socket domain: %w", ErrHandoff, err)
	}
	if dom != unix.AF_INET && dom != unix.AF_INET6 && dom != unix.AF_UNIX {
		return nil, fmt.Errorf("%w: socket family %d, want inet, inet6 or unix", ErrHandoff, dom)
	}
	if acc, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || acc != 0 {
		return nil, fmt.Errorf("%w: a listening socket", ErrHandoff)
	}
	if _, err := unix.Getpeername(fd); err != nil {
		return nil, fmt.Errorf("%w: socket not connected: %w", ErrHandoff, err)
	}
	c, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrHandoff, err)
	}
	return c, nil
}
