package sandboxd

import (
	"errors"
	"fmt"
	"os"
	"strings"
)

// sessionToken reads gateway_session_token_file: the bearer token sandboxd
// shows the gateway's admin listener (its SHA-256 is in the gateway's
// gateway.session_tokens_sha256). Errors name the key, never the token.
func sessionToken(file string) (string, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return "", fmt.Errorf("gateway_session_token_file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", errors.New("gateway_session_token_file: empty")
	}
	return tok, nil
}

// sessionCarried reports whether a live sandbox or pin still carries
// session: its end waits for the last of them.
func (m *Manager) sessionCarried(session string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, b := range m.boxes {
		if b.info.Session == session {
			return true
		}
	}
	for _, p := range m.pins {
		if p.info.Session == session {
			return true
		}
	}
	return false
}

// endPinSession tells the gateway that a removed pin's session ended, the
// same POST gateway_admin/api/v1/sessions/{session}/end that Destroy sends
// (postSessionEnd), under the same conditions: both gateway keys set, the
// pin carried a session, and no live sandbox or pin carries it any more. A
// failure is logged and recorded as the event session_end_failed; it never
// fails the unpin (the listeners are closed either way, and an operator can
// still end the session with sluice sessions end).
func (m *Manager) endPinSession(info PinInfo) {
	if m.cfg.GatewayAdmin == "" || m.cfg.GatewaySessionTokenFile == "" || info.Session == "" {
		return
	}
	if m.sessionCarried(info.Session) {
		return
	}
	ev := event{Event: "session_ended", Sandbox: info.ID, Agent: info.Agent, Session: info.Session, User: info.User, NetNS: info.NetNS}
	if err := postSessionEnd(m.cfg.GatewayAdmin, m.cfg.GatewaySessionTokenFile, info.Session); err != nil {
		m.log.Warn("pin session not ended at the gateway", "sandbox", info.ID, "session", info.Session, "err", err)
		ev.Event, ev.Error = "session_end_failed", err.Error()
	}
	m.events.write(ev)
}
