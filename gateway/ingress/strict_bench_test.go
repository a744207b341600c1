package ingress

import (
	"strings"
	"testing"
)

// BenchmarkHeadChecker is the strict checker's cost for one typical
// forward-proxy request head, read in one piece.
func BenchmarkHeadChecker(b *testing.B) {
	const req = "GET http://pkg.example/x?q=1 HTTP/1.1\r\nHost: pkg.example\r\nUser-Agent: Go-http-client/1.1\r\nAccept: */*\r\nAccept-Encoding: gzip\r\n\r\n"
	buf := make([]byte, 4096)
	r := strings.NewReader("")
	h := &headChecker{src: r}
	b.ReportAllocs()
	for b.Loop() {
		r.Reset(req)
		if _, err := h.Read(buf); err != nil {
			b.Fatal(err)
		}
	}
}
