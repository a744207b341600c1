// Package wiretest is a gateway stand-in for tests of code that relays to
// the gateway: a Unix socket that reads each connection's SLUICE-IDENTITY
// preamble with wire.Read and hands the rest of the connection to a
// test-supplied handler.
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
// preamble. If the preamble is invalid, id is zero and err says why.
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
				br := bufio.NewReader(c)
				id, err := wire.Read(br)
				h(c, br, id, err)
			}()
		}
	}()
	return path
}
