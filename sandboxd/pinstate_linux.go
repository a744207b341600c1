package sandboxd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// pinsDir is the directory under state_dir that holds one JSON file per
// pin: what a new sandboxd needs to open the pin's listeners again after
// the old one died (kill -9, a crash, an upgrade), so a pinned namespace
// keeps its one exit across restarts. Only root reads or writes it.
const pinsDir = "pins"

// pinRecord is a pin's state file. The namespace is named by its path and
// by its nsfs inode: a path that names another namespace by then (a reused
// pid, a netns name made again) is not re-adopted.
type pinRecord struct {
	Info   PinInfo  `json:"info"`
	Dev    uint64   `json:"dev"`
	Ino    uint64   `json:"ino"`
	Egress []string `json:"egress_request,omitempty"`
}

func (m *Manager) pinFile(id string) string {
	return filepath.Join(m.cfg.StateDir, pinsDir, id+".json")
}

// savePin writes the pin's state file whole (a temporary file renamed over
// it), so a sandboxd killed mid-write leaves the old file or the new one.
func (m *Manager) savePin(info PinInfo, key nsKey, egress []string) error {
	dir := filepath.Join(m.cfg.StateDir, pinsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	b, err := json.Marshal(pinRecord{Info: info, Dev: key.dev, Ino: key.ino, Egress: egress})
	if err != nil {
		return fmt.Errorf("state: %w", err)
	}
	tmp := m.pinFile(info.ID) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return fmt.Errorf("state: %w", err)
	}
	if err := os.Rename(tmp, m.pinFile(info.ID)); err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("state: %w", err)
	}
	return nil
}

// forgetPin removes the pin's state file: it is not re-adopted.
func (m *Manager) forgetPin(id string) {
	if err := os.Remove(m.pinFile(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.log.Warn("pin state not removed", "sandbox", id, "err", err)
	}
}

// releasePin closes a pin's listeners when sandboxd stops, but keeps its
// state file and its session: the next sandboxd re-adopts it. Pods' pins
// are released, not unpinned, on Close: their lifetime is the pod's (the
// runtime's CNI DEL ends it), not sandboxd's.
func (m *Manager) releasePin(id string) error {
	m.mu.Lock()
	e, ok := m.pins[id]
	delete(m.pins, id)
	m.mu.Unlock()
	if !ok {
		return nil
	}
	close(e.stop)
	err := e.p.Close()
	m.mu.Lock()
	delete(m.pinning, e.key)
	m.mu.Unlock()
	m.events.write(event{Event: "pin_released", Sandbox: id, Agent: e.info.Agent, Session: e.info.Session, User: e.info.User, NetNS: e.info.NetNS})
	if err != nil {
		return fmt.Errorf("sandboxd: release pin %s: %w", id, err)
	}
	return nil
}

// readoptPins opens the listeners of every pin a previous sandboxd left in
// state_dir, on the same namespace (checked by inode) with the same id and
// identity. A pin whose namespace is gone is reported (event pin_lost)
// and its session ended; one that cannot be pinned again is reported
// (pin_readopt_failed) and dropped, its namespace still closed by the
// ruleset it kept. A bad state file is reported and skipped; it never
// stops the others.
func (m *Manager) readoptPins(ctx context.Context) {
	dir := filepath.Join(m.cfg.StateDir, pinsDir)
	ents, err := os.ReadDir(dir)
	if err != nil {
		if !errors.Is(err, os.ErrNotExist) {
			m.log.Warn("pin state: cannot list", "dir", dir, "err", err)
		}
		return
	}
	for _, e := range ents {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		id, ok := strings.CutSuffix(name, ".json")
		if !ok {
			continue
		}
		var r pinRecord
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err == nil {
			err = json.Unmarshal(b, &r)
		}
		if err == nil && r.Info.ID != id {
			err = fmt.Errorf("holds pin %q", r.Info.ID)
		}
		if err != nil {
			m.log.Warn("pin state: unreadable, skipped", "file", name, "err", err)
			m.events.write(event{Event: "pin_readopt_failed", Sandbox: id, Error: "state file " + name + ": " + err.Error()})
			_ = os.Remove(filepath.Join(dir, name))
			continue
		}
		in := r.Info
		req := PinRequest{NetNS: in.NetNS, Agent: in.Agent, Session: in.Session, User: in.User, Egress: r.Egress}
		key := nsKey{dev: r.Dev, ino: r.Ino}
		if _, err := m.pin(ctx, req, pinAs{id: in.ID, created: in.Created, pod: in.Pod, key: &key}); err != nil {
			ev := "pin_readopt_failed"
			if why := pinGone(in.NetNS, key); why != "" {
				ev, err = "pin_lost", errors.New(why)
			}
			m.log.Warn("pin not re-adopted", "sandbox", in.ID, "netns", in.NetNS, "event", ev, "err", err)
			m.events.write(event{Event: ev, Sandbox: in.ID, Agent: in.Agent, Session: in.Session, User: in.User, NetNS: in.NetNS, Error: err.Error()})
			m.forgetPin(in.ID)
			m.endPinSession(in)
			continue
		}
		m.log.Info("pin re-adopted", "sandbox", in.ID, "netns", in.NetNS)
	}
}
