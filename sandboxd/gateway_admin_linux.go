package sandboxd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// adminTimeout bounds one call to the gateway's admin listener.
const adminTimeout = 5 * time.Second

// maxReports is how many limit reports may be on their way to the gateway
// at once; a kill past it is recorded as gateway_report_dropped.
const maxReports = 8

// postAdmin POSTs body (JSON, or nothing) to path on the gateway's admin
// listener at base with the token of gateway_session_token_file, and wants
// 200. No proxy from the environment and no redirects: the token goes only
// to the configured listener. Errors never carry the token.
func postAdmin(base, tokenFile, path string, body []byte) error {
	tok, err := sessionToken(tokenFile) // session_end_linux.go
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+tok)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	client := &http.Client{Transport: &http.Transport{Proxy: nil}, CheckRedirect: func(*http.Request, []*http.Request) error {
		return http.ErrUseLastResponse
	}}
	defer client.CloseIdleConnections()
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d: %.200s", resp.StatusCode, msg)
	}
	return nil
}

// limitReport is the body of the gateway's POST /api/v1/sandbox-events.
type limitReport struct {
	Event   string `json:"event"`
	Sandbox string `json:"sandbox"`
	Agent   string `json:"agent,omitempty"`
	Session string `json:"session,omitempty"`
	User    string `json:"user,omitempty"`
	Host    string `json:"host,omitempty"`
	Limit   int64  `json:"limit,omitempty"`
	Egress  string `json:"egress,omitempty"` // the sandbox's narrowing, as in its preamble
}

// reportEvent tells the gateway, in the background, that a command of sb
// was killed by a limit (kind oom, pids_limit or timeout; limit the value
// reached) or that sb's init died (kind init_died, limit 0), so that it is
// in the gateway's hash-chained audit log (sandbox_<kind>) beside the
// sandbox's calls (THREATS B2, A13). It runs only
// when gateway_admin and gateway_session_token_file are set. A report that
// fails is recorded as the event gateway_report_failed, one that finds
// maxReports in flight as gateway_report_dropped; neither changes the
// command's result. Close waits for reports in flight.
func (m *Manager) reportEvent(sb *sandbox, kind string, limit int64) {
	if m.cfg.GatewayAdmin == "" || m.cfg.GatewaySessionTokenFile == "" {
		return
	}
	info := sb.info
	ev := event{Event: "gateway_report_failed", Sandbox: info.ID, Agent: info.Agent, Session: info.Session, User: info.User}
	select {
	case m.reports <- struct{}{}:
	default:
		ev.Event, ev.Error = "gateway_report_dropped", fmt.Sprintf("%d reports already on their way", maxReports)
		m.events.write(ev)
		return
	}
	body, err := json.Marshal(limitReport{Event: kind, Sandbox: info.ID, Agent: info.Agent, Session: info.Session,
		User: info.User, Host: m.cfg.Host, Limit: limit, Egress: strings.Join(info.Egress, ",")})
	if err != nil {
		<-m.reports
		ev.Error = err.Error()
		m.events.write(ev)
		return
	}
	m.pending.Add(1)
	go func() {
		defer m.pending.Done()
		defer func() { <-m.reports }()
		if err := postAdmin(m.cfg.GatewayAdmin, m.cfg.GatewaySessionTokenFile, "/api/v1/sandbox-events", body); err != nil {
			m.log.Warn("sandbox event not reported to the gateway", "sandbox", info.ID, "event", kind, "err", err)
			ev.Error = "report " + kind + ": " + err.Error()
			m.events.write(ev)
		}
	}()
}
