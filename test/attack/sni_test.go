//go:build linux

package attack

import (
	"encoding/binary"
	"net/http"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// helloWithSNI is a real ClientHello for pkg.test whose server_name
// extension is replaced by one listing names (host_name type), with every
// enclosing length fixed: the shapes crypto/tls will not send.
func helloWithSNI(t *testing.T, names ...string) []byte {
	t.Helper()
	rec := clientHello(t, "pkg.test")
	hs := rec[5:]
	body := hs[4:]
	p := 2 + 32
	p += 1 + int(body[p])                           // session id
	p += 2 + int(binary.BigEndian.Uint16(body[p:])) // cipher suites
	p += 1 + int(body[p])                           // compression methods
	exts := body[p+2 : p+2+int(binary.BigEndian.Uint16(body[p:]))]
	var list []byte
	for _, n := range names {
		list = append(list, 0)
		list = binary.BigEndian.AppendUint16(list, uint16(len(n)))
		list = append(list, n...)
	}
	sni := binary.BigEndian.AppendUint16(nil, uint16(len(list)))
	sni = append(sni, list...)
	var out []byte
	for len(exts) >= 4 {
		typ, n := binary.BigEndian.Uint16(exts), int(binary.BigEndian.Uint16(exts[2:]))
		data := exts[4 : 4+n]
		exts = exts[4+n:]
		if typ == 0 {
			data = sni
		}
		out = binary.BigEndian.AppendUint16(out, typ)
		out = binary.BigEndian.AppendUint16(out, uint16(len(data)))
		out = append(out, data...)
	}
	nb := append([]byte(nil), body[:p]...)
	nb = binary.BigEndian.AppendUint16(nb, uint16(len(out)))
	nb = append(nb, out...)
	nhs := []byte{hs[0], byte(len(nb) >> 16), byte(len(nb) >> 8), byte(len(nb))}
	nhs = append(nhs, nb...)
	nrec := []byte{rec[0], rec[1], rec[2], byte(len(nhs) >> 8), byte(len(nhs))}
	return append(nrec, nhs...)
}

// TestGatewaySNIShapes is the rest of THREATS F5: server names crypto/tls
// cannot send, in a hand-built ClientHello after CONNECT pkg.test:443.
// Each is refused (tunnel closed, nothing sent back, audit sni_mismatch,
// no upstream connection); the same hand-built hello naming pkg.test
// alone is tunnelled, so the refusals are the names'.
func TestGatewaySNIShapes(t *testing.T) {
	w := newWorld(t)
	const connect = "CONNECT pkg.test:443 HTTP/1.1\r\nHost: pkg.test:443\r\n\r\n"
	for _, tc := range []struct {
		name  string
		names []string
	}{
		{"two host names (pkg.test, evil.test)", []string{"pkg.test", "evil.test"}},
		{"trailing dot (pkg.test.)", []string{"pkg.test."}},
		{"non-ASCII bytes (pkg.t\u00ebst)", []string{"pkg.t\u00ebst"}},
		{"the same name twice", []string{"pkg.test", "pkg.test"}},
		{"empty name", []string{""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "F5", "CONNECT pkg.test:443, then a hand-built ClientHello whose SNI has "+tc.name,
				"tunnel closed with no byte sent back, audit sni_mismatch, 0 TLS upstream connections")
			tl := w.tlsConn.Load()
			before := len(w.g.For(t).AuditEvent("sni_mismatch", "pkg.test"))
			resp, _, conn, br := w.exchange(t, agentA, connect)
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("CONNECT: %d", resp.StatusCode)
			}
			if _, err := conn.Write(helloWithSNI(t, tc.names...)); err != nil {
				t.Fatal(err)
			}
			n, _ := br.Discard(1 << 20)
			audited := w.awaitAuditCount(t, "sni_mismatch", "pkg.test", before+1)
			c.Observef("bytes back %d, audit sni_mismatch %v, TLS upstream connections %d", n, audited, w.tlsConn.Load()-tl)
			if n != 0 || !audited || w.tlsConn.Load() != tl {
				t.Errorf("bytes back %d, audited %v, upstream connections %d", n, audited, w.tlsConn.Load()-tl)
			}
		})
	}
	t.Run("control: the hand-built hello naming pkg.test alone", func(t *testing.T) {
		c := casebook.Expect(t, "F5", "control: CONNECT pkg.test:443 and the same hand-built ClientHello with SNI pkg.test",
			"the hello goes to the upstream (1 TLS upstream connection): the refusals above are the names'")
		tl := w.tlsConn.Load()
		resp, _, conn, _ := w.exchange(t, agentA, connect)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("CONNECT: %d", resp.StatusCode)
		}
		if _, err := conn.Write(helloWithSNI(t, "pkg.test")); err != nil {
			t.Fatal(err)
		}
		deadline := time.Now().Add(10 * time.Second)
		for w.tlsConn.Load() == tl && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		c.Observef("TLS upstream connections %d", w.tlsConn.Load()-tl)
		if w.tlsConn.Load()-tl != 1 {
			t.Fatalf("the well-formed hand-built hello was not tunnelled: %d upstream connections", w.tlsConn.Load()-tl)
		}
	})
}
