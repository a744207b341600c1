// Package wiretest is a gateway stand-in for tests of code that relays to
// the gateway: a Unix socket that reads each connection's preamble with
// wire.Receive (a SLUICE-IDENTITY line, or a SLUICE-HANDOFF line with the
// sandbox's connection passed along) and hands the rest of the connection
// to a test-supplied handler.
package wiretest

import (
	"bufio"
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Handler serves one relayed connection; br holds the bytes after the
// preamble. For a handoff, c and br are the passed connection. If the
// preamble is invalid, id is zero, err says why and c is the connection to
// the gateway socket.
type Handler func(c net.Conn, br *bufio.Reader, id wire.Identity, err error)

// Gateway listens on a fresh Unix socket (in a short temporary directory, so
// the path fits sun_path), serves every connection with h until the test
// ends, and returns the socket's path. Each connection is closed after h.
func Gateway(tb testing.TB, h Handler) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", "gw")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "gw.sock")
	l, err := net.Listen("unix", path)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				p, err := wire.Receive(c.(*net.UnixConn))
				switch {
				case err != nil:
					h(c, bufio.NewReader(c), wire.Identity{}, err)
				case p.Conn != nil:
					// Closing the lease (deferred) after the passed
					// connection tells the relay it is done.
					defer p.Conn.Close()
					h(p.Conn, bufio.NewReader(p.Conn), p.Identity, nil)
				default:
					h(c, p.Reader, p.Identity, nil)
				}
			}()
		}
	}()
	return path
}
