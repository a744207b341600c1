package ingress

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestIdentConnDetach: after a CONNECT head read through the server's
// reader, Conn's reader and strictHeads' checker, the bytes the
// server's reader and detach return, followed by what is still in the
// socket, are exactly the tunnel's bytes in order, whatever the layers'
// buffer sizes left where; and the connection is marked a tunnel.
func TestIdentConnDetach(t *testing.T) {
	head := "CONNECT pkg.example:443 HTTP/1.1\r\nHost: pkg.example:443\r\n\r\n"
	tunnel := strings.Repeat("0123456789abcdef", 40) // 640 bytes after the head
	for _, tc := range []struct {
		name         string
		strict       bool // strictHeads wrapped r in a checker and a reader
		base, server int  // buffer sizes: Conn's base and the server's
	}{
		{"strict, small buffers", true, 16, 16},
		{"strict, base holds tunnel bytes", true, 512, 16},
		{"strict, server holds tunnel bytes", true, 16, 4096},
		{"strict, large buffers", true, 4096, 4096},
		{"no checker", false, 64, 32},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sock := strings.NewReader(head + tunnel) // the socket's byte stream
			base := bufio.NewReaderSize(sock, tc.base)
			ic := &Conn{r: base, base: base}
			if tc.strict { // as strictHeads.Accept does
				ic.r = bufio.NewReaderSize(&headChecker{src: ic.r}, 16)
			}
			srv := bufio.NewReaderSize(ic, tc.server)
			req, err := http.ReadRequest(srv)
			if err != nil || req.Method != http.MethodConnect {
				t.Fatalf("CONNECT head: %v %v", req, err)
			}
			got, _ := srv.Peek(srv.Buffered())
			got = append(got[:len(got):len(got)], ic.Detach()...)
			rest, _ := io.ReadAll(sock)
			got = append(got, rest...)
			if string(got) != tunnel {
				t.Fatalf("tunnel bytes after detach: %d bytes %q…, want %d bytes", len(got), got[:min(len(got), 32)], len(tunnel))
			}
			if !ic.tunnel.Load() {
				t.Fatal("detach did not mark the connection a tunnel")
			}
		})
	}
}
