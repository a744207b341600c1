package gateway

import (
	"bufio"
	"net"
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// The whole gateway's raw egress, for the tests that need more than
// package egress's own harness (ending a session in the store, Serve's
// shutdown, the strict heads in front of every route): what those tests
// share.

// startEgressGateway runs a gateway whose agent-a may reach *.allowed.test,
// pkg.example and rebind.test, resolving with up.
func startEgressGateway(t testing.TB, up *egresstest.DNSUpstream, edit func(*config.Config)) *testGateway {
	t.Helper()
	return startGateway(t, "http://127.0.0.1:1", "", func(c *config.Config) {
		egresstest.Configure(c, up)
		if edit != nil {
			edit(c)
		}
	})
}

// rawConn opens the sandbox socket as a relay would, preamble sent.
func rawConn(t *testing.T, g *testGateway, id wire.Identity) net.Conn {
	return egresstest.RawConn(t, g.cfg.Gateway.SandboxSocket, id)
}

// exchange sends raw request bytes as agentA and reads one response.
func exchange(t *testing.T, g *testGateway, req string) (*http.Response, []byte, net.Conn, *bufio.Reader) {
	return egresstest.Exchange(t, g.cfg.Gateway.SandboxSocket, agentA, req)
}

// errCode is the refusal code of a JSON error body.
func errCode(body []byte) string { return egresstest.ErrCode(body) }
