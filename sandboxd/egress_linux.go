package sandboxd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// ErrEgress refuses a create whose --egress the gateway does not confirm
// as a narrowing of the agent's allowlist (403 egress_not_granted), or
// cannot confirm at all.
var ErrEgress = errors.New("egress not granted")

// checkEgress asks the gateway, as the sandbox id will speak to it (id's
// preamble, narrowing included), for the sandbox's tools: the gateway
// knows the agent's egress allowlist (sandboxd holds no policy) and
// answers 403 egress_not_granted when the narrowing names a host outside
// it. Anything but a 200 refuses the create: a narrowing that cannot be
// confirmed is not granted (fail closed). The gateway enforces the
// intersection at every request in any case; this check makes a wider
// --egress an error at create instead of a silent no-op.
func (m *Manager) checkEgress(ctx context.Context, id wire.Identity) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		if m.cfg.GatewayTLS.Address != "" {
			return wire.DialTLS(ctx, m.cfg.GatewayTLS.Address, m.gwTLS, id)
		}
		return wire.Dial(ctx, m.cfg.Gateway, id)
	}
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://sluice/v1/tools", nil)
	if err != nil {
		return fmt.Errorf("bug(): %w", err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		return fmt.Errorf("%w: the gateway cannot confirm egress %s: %v", ErrEgress, id.Egress, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		return nil
	}
	var e struct {
		Error struct{ Code, Message string } `json:"error"`
	}
	_ = json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&e)
	if e.Error.Code == "" {
		return fmt.Errorf("%w: the gateway answered %s to egress %s", ErrEgress, resp.Status, id.Egress)
	}
	return fmt.Errorf("%w: the gateway answers %s: %s", ErrEgress, e.Error.Code, e.Error.Message)
}
