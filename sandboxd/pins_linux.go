package sandboxd

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/sandboxd/pin"
	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// ErrConflict is returned when a namespace is already pinned.
var ErrConflict = errors.New("already pinned")

// PinRequest asks to pin a network namespace another runtime made (a
// container, a pod). Exactly one of NetNS and PID is set.
type PinRequest struct {
	NetNS   string `json:"netns,omitempty"` // e.g. /run/netns/NAME
	PID     int    `json:"pid,omitempty"`   // or a process in the namespace
	Agent   string `json:"agent"`
	Session string `json:"session,omitempty"`
	User    string `json:"user,omitempty"`
	// Egress narrows the agent's egress allowlist for the pinned
	// namespace, as CreateRequest.Egress does for a sandbox.
	Egress []string `json:"egress,omitempty"`
}

// PinInfo describes a pinned namespace. ID is also the identity's sandbox
// field for every connection relayed from it.
type PinInfo struct {
	ID      string    `json:"id"`
	NetNS   string    `json:"netns"`
	Agent   string    `json:"agent"`
	Session string    `json:"session,omitempty"`
	User    string    `json:"user,omitempty"`
	Egress  []string  `json:"egress,omitempty"`
	Created time.Time `json:"created"`
	// Pod is set for a pin sluice-cni asked for (POST /v1/pods).
	Pod *PodRef `json:"pod,omitempty"`
}

// nsKey identifies a namespace by its nsfs inode, so the same namespace
// named by a path and by a pid is one namespace.
type nsKey struct{ dev, ino uint64 }

type pinEntry struct {
	info PinInfo
	key  nsKey
	p    *pin.Pinned
	stop chan struct{} // closed by the one unpin that removes the entry
}

// pinWatchInterval is how often a pin checks that the other runtime has
// not torn its namespace down.
var pinWatchInterval = time.Second

// Pin closes a namespace made by another runtime to everything but
// loopback and opens the relay's listeners inside it (sandboxd/pin). The
// namespace is opened once and handed to pin by its fd, so a pid reused
// between the checks and the pin cannot redirect it. Pinning sandboxd's
// own namespace is ErrInvalid; pinning a pinned namespace is ErrConflict.
func (m *Manager) Pin(ctx context.Context, req PinRequest) (PinInfo, error) {
	return m.pin(ctx, req, pinAs{})
}

// pinAs is what a pin carries besides its request: a pod's reference,
// and for a pin re-adopted after a restart its id and creation time.
type pinAs struct {
	id      string
	created time.Time
	pod     *PodRef
	key     *nsKey // re-adoption: the namespace the pin was made on
}

func (m *Manager) pin(ctx context.Context, req PinRequest, as pinAs) (PinInfo, error) {
	path, err := req.path()
	if err != nil {
		return PinInfo{}, err
	}
	id := as.id
	if id == "" {
		id = "pin-" + newID()
	}
	if req.Agent == "" {
		return PinInfo{}, fmt.Errorf("%w: agent is required", ErrInvalid)
	}
	ident := wire.Identity{Sandbox: id, Agent: req.Agent, Session: req.Session, User: req.User, Host: m.cfg.Host}
	var egress []string
	if req.Egress != nil {
		if ident.Egress, err = wire.FormatEgress(req.Egress); err != nil {
			return PinInfo{}, fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		egress, _ = wire.ParseEgress(ident.Egress)
	}
	if err := ident.Validate(); err != nil {
		return PinInfo{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	// A re-adopted pin's egress was checked when it was made; asking the
	// gateway again would leave the namespace without exits while it is down.
	if ident.Egress != "" && as.id == "" {
		if err := m.checkEgress(ctx, ident); err != nil {
			m.events.write(event{Event: "egress_refused", Sandbox: id, Agent: req.Agent, Session: req.Session, User: req.User, Egress: ident.Egress, Error: err.Error()})
			return PinInfo{}, fmt.Errorf("sandboxd: pin: %w", err)
		}
	}
	ns, err := os.Open(path)
	if err != nil {
		return PinInfo{}, fmt.Errorf("%w: %s: %w", ErrInvalid, req.field(), err)
	}
	defer ns.Close()
	key, err := checkPinTarget(ns)
	if err != nil {
		return PinInfo{}, fmt.Errorf("%w: %s: %w", ErrInvalid, req.field(), err)
	}
	if as.key != nil && *as.key != key {
		return PinInfo{}, fmt.Errorf("%w: %s %s names another namespace than the one pinned", ErrNotFound, req.field(), path)
	}

	// Reserve the namespace before the slow part, so two concurrent pins
	// of it cannot both proceed.
	m.mu.Lock()
	switch {
	case m.closed:
		m.mu.Unlock()
		return PinInfo{}, errors.New("sandboxd: pin: manager closed")
	case m.pinning[key]:
		m.mu.Unlock()
		return PinInfo{}, fmt.Errorf("%w: %s %s", ErrConflict, req.field(), path)
	}
	m.pinning[key] = true
	m.mu.Unlock()
	ok := false
	defer func() {
		if !ok {
			m.mu.Lock()
			delete(m.pinning, key)
			m.mu.Unlock()
		}
	}()

	p, err := pin.Pin(ctx, pin.Options{
		NetNS: "/proc/self/fd/" + strconv.Itoa(int(ns.Fd())), Identity: ident, Gateway: m.cfg.Gateway,
		GatewayAddr: m.cfg.GatewayTLS.Address, GatewayTLS: m.gwTLS,
		ProxyPort: ProxyPort, DNSPort: DNSPort, DNSCacheFor: m.cfg.relayDNSCache(), Logger: m.log,
	})
	if err != nil {
		return PinInfo{}, fmt.Errorf("sandboxd: pin %s: %w", path, err)
	}
	info := PinInfo{ID: id, NetNS: path, Agent: req.Agent, Session: req.Session, User: req.User, Egress: egress, Created: time.Now().UTC(), Pod: as.pod}
	if !as.created.IsZero() {
		info.Created = as.created
	}
	// Written before the pin is announced: a sandboxd killed from here on
	// finds it in state_dir and opens its listeners again (pinstate_linux.go).
	if err := m.savePin(info, key, req.Egress); err != nil {
		_ = p.Close()
		return PinInfo{}, fmt.Errorf("sandboxd: pin %s: %w", path, err)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		_ = p.Close()
		m.forgetPin(id)
		return PinInfo{}, errors.New("sandboxd: pin: manager closed")
	}
	e := &pinEntry{info: info, key: key, p: p, stop: make(chan struct{})}
	m.pins[id] = e
	m.pending.Add(1) // under mu: Close waits for the watcher
	m.mu.Unlock()
	ok = true
	ev := "pinned"
	if as.id != "" {
		ev = "pin_readopted"
	}
	m.events.write(event{Event: ev, Sandbox: id, Agent: req.Agent, Session: req.Session, User: req.User, NetNS: path})
	go m.watchPin(id, path, e)
	m.log.Info("namespace pinned", "sandbox", id, "netns", path, "agent", req.Agent)
	return info, nil
}

func (r PinRequest) field() string {
	if r.PID != 0 {
		return "pid"
	}
	return "netns"
}

// path checks the request's target and returns the namespace path.
func (r PinRequest) path() (string, error) {
	switch {
	case r.NetNS != "" && r.PID != 0:
		return "", fmt.Errorf("%w: netns, pid: set one, not both", ErrInvalid)
	case r.NetNS != "":
		if !filepath.IsAbs(r.NetNS) {
			return "", fmt.Errorf("%w: netns: must be an absolute path, got %q", ErrInvalid, r.NetNS)
		}
		return r.NetNS, nil
	case r.PID < 0:
		return "", fmt.Errorf("%w: pid: must be positive, got %d", ErrInvalid, r.PID)
	case r.PID > 0:
		return "/proc/" + strconv.Itoa(r.PID) + "/ns/net", nil
	default:
		return "", fmt.Errorf("%w: netns or pid is required", ErrInvalid)
	}
}

// checkPinTarget refuses anything but a network namespace other than
// sandboxd's own (pin checks again; this gives the API a 400 and a key).
func checkPinTarget(ns *os.File) (nsKey, error) {
	typ, err := unix.IoctlRetInt(int(ns.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return nsKey{}, fmt.Errorf("not a namespace: %w", err)
	}
	if typ != unix.CLONE_NEWNET {
		return nsKey{}, errors.New("not a network namespace")
	}
	var st, own unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &st); err != nil {
		return nsKey{}, fmt.Errorf("stat: %w", err)
	}
	if err := relay.OwnNetNS(&own); err != nil {
		return nsKey{}, fmt.Errorf("stat own netns: %w", err)
	}
	if st.Dev == own.Dev && st.Ino == own.Ino {
		return nsKey{}, errors.New("refusing to pin sandboxd's own network namespace")
	}
	return nsKey{dev: st.Dev, ino: st.Ino}, nil
}

// Pins describes every pinned namespace, oldest first.
func (m *Manager) Pins() []PinInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]PinInfo, 0, len(m.pins))
	for _, e := range m.pins {
		out = append(out, e.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.Before(out[j].Created) })
	return out
}

// Unpin closes a pinned namespace's listeners and every connection relayed
// from it, and ends its session at the gateway as Destroy does (when no
// live sandbox or pin carries it any more; see endPinSession). The
// namespace stays closed (its ruleset and removed interfaces stay as they
// are): unpinning never reopens it. A pin whose namespace the other
// runtime tears down is unpinned the same way (watchPin).
func (m *Manager) Unpin(id string) error {
	m.mu.Lock()
	e, ok := m.pins[id]
	delete(m.pins, id)
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: pin %q", ErrNotFound, id)
	}
	close(e.stop)
	err := e.p.Close()
	m.forgetPin(id)
	// Only once the listeners are closed may the namespace be pinned again.
	m.mu.Lock()
	delete(m.pinning, e.key)
	m.mu.Unlock()
	m.events.write(event{Event: "unpinned", Sandbox: id, Agent: e.info.Agent, Session: e.info.Session, User: e.info.User, NetNS: e.info.NetNS})
	m.log.Info("namespace unpinned", "sandbox", id, "netns", e.info.NetNS)
	m.endPinSession(e.info)
	if err != nil {
		return fmt.Errorf("sandboxd: unpin %s: %w", id, err)
	}
	return nil
}

// watchPin unpins a pin once the other runtime has torn its namespace
// down: sandboxd's own handle keeps the namespace alive, so the sign is
// that the path it was pinned by no longer names it (ip netns del unmounts
// and removes /run/netns/NAME; /proc/PID/ns/net is gone once the process
// has exited, or names another namespace if the pid was reused). It
// returns when the pin is removed, by whichever Unpin removes it.
func (m *Manager) watchPin(id, path string, e *pinEntry) {
	defer m.pending.Done()
	t := time.NewTicker(pinWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-e.stop:
			return
		case <-t.C:
		}
		why := pinGone(path, e.key)
		if why == "" {
			continue
		}
		m.log.Info("pinned namespace torn down by its runtime", "sandbox", id, "netns", path, "why", why)
		m.events.write(event{Event: "pin_namespace_gone", Sandbox: id, Agent: e.info.Agent, Session: e.info.Session, User: e.info.User, NetNS: path, Error: why})
		if err := m.Unpin(id); err != nil && !errors.Is(err, ErrNotFound) {
			m.log.Warn("unpin after teardown", "sandbox", id, "err", err)
		}
		return
	}
}

// pinGone says why path no longer names the pinned namespace key, or ""
// while it does. Only a definite answer counts: an error other than "does
// not exist" (a transient EMFILE, say) leaves the pin in place.
func pinGone(path string, key nsKey) string {
	var st unix.Stat_t
	switch err := unix.Stat(path, &st); {
	case errors.Is(err, unix.ENOENT), errors.Is(err, unix.ESRCH):
		return path + " no longer exists"
	case err != nil:
		return ""
	case st.Dev != key.dev || st.Ino != key.ino:
		return path + " names another namespace"
	}
	return ""
}
