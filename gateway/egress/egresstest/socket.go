package egresstest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// RawConn opens the sandbox socket sock as a relay would, id's preamble
// sent; it is closed when t ends.
func RawConn(t testing.TB, sock string, id wire.Identity) net.Conn {
	t.Helper()
	c, err := wire.Dial(context.Background(), sock, id)
	if err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	t.Cleanup(func() { c.Close() })
	return c
}

// Exchange sends raw request bytes on a new connection to sock as id and
// reads one response; its body is read unless it is a CONNECT's 200.
func Exchange(t testing.TB, sock string, id wire.Identity, req string) (*http.Response, []byte, net.Conn, *bufio.Reader) {
	t.Helper()
	c := RawConn(t, sock, id)
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("read response to %q: %v", req, err)
	}
	var body []byte
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(req, "CONNECT") {
		body, _ = io.ReadAll(resp.Body)
	}
	return resp, body, c, br
}

// ErrCode is the refusal code of a JSON error body.
func ErrCode(body []byte) string {
	var b refusal.Body
	_ = json.Unmarshal(body, &b)
	return string(b.Error.Code)
}

// AuditRecords reads every record of the audit log at path; none may
// carry secret.
func AuditRecords(t testing.TB, path, secret string) []audit.Record {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(data), secret) {
		t.Error("audit log contains the secret")
	}
	var recs []audit.Record
	for l := range strings.Lines(string(data)) {
		var r audit.Record
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("audit line %q: %v", l, err)
		}
		recs = append(recs, r)
	}
	return recs
}
