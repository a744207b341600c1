// Package pin gives a sandbox made by another runtime (a container, a pod)
// the same single exit as sandboxd's own: it takes the sandbox's network
// namespace, loads an nftables ruleset that drops everything but loopback
// (IPv4 and IPv6), removes every interface but lo and every route that does
// not stay on lo, and opens the relay's host-side listeners inside it.
//
// Nothing is injected into the sandbox's mount namespace, so pinning works
// for pods under restrictive policies. The ruleset is loaded first so the
// namespace is closed from the first step on: if a later step fails, Pin
// returns an error and leaves the namespace closed, never half open.
//
// Pin needs iproute2 (ip), nftables (nft) and nsenter (util-linux), and
// CAP_SYS_ADMIN and CAP_NET_ADMIN over the namespace.
package pin

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Table is the nftables table Pin loads into the pinned namespace.
const Table = "sluice_pin"

// Ruleset is what Pin loads with `nft -f -`: base chains with a drop policy
// on input, output and forward for the inet family (IPv4 and IPv6), which
// accept only traffic on lo. A drop in any base chain is final, so rules the
// other runtime left in its own tables cannot reopen the namespace. The
// first two lines make loading idempotent (re-pinning replaces the table).
const Ruleset = `table inet ` + Table + `
delete table inet ` + Table + `
table inet ` + Table + ` {
	chain input {
		type filter hook input priority -400; policy drop;
		iif "lo" accept
	}
	chain output {
		type filter hook output priority -400; policy drop;
		oif "lo" accept
	}
	chain forward {
		type filter hook forward priority -400; policy drop;
	}
}
`

// Options say which namespace to pin and whom its connections belong to.
// Exactly one of NetNS and PID is set.
type Options struct {
	NetNS    string        // a network namespace path, e.g. /run/netns/NAME or /proc/PID/ns/net
	PID      int           // or a process whose network namespace is pinned (/proc/PID/ns/net)
	Identity wire.Identity // sent as the preamble of every relayed connection
	Gateway  string        // the gateway's Unix socket
	// GatewayAddr and GatewayTLS: a remote gateway, as in relay.Options.
	GatewayAddr string
	GatewayTLS  *tls.Config
	ProxyPort   int           // default relay.DefaultProxyPort
	DNSPort     int           // default relay.DefaultDNSPort
	DNSCacheFor time.Duration // as relay.Options.DNSCacheFor
	Logger      *slog.Logger
}

// Pinned is a pinned namespace with its relay listeners open.
type Pinned struct {
	NetNS string // the namespace as given (path or /proc/PID/ns/net)
	ns    *os.File
	relay *relay.Relay
}

// Pin closes the namespace to everything but loopback and opens the relay's
// listeners inside it. It refuses the namespace sandboxd itself runs in.
func Pin(ctx context.Context, opts Options) (*Pinned, error) {
	path, err := nsPath(opts)
	if err != nil {
		return nil, err
	}
	if _, err := wire.Encode(opts.Identity); err != nil {
		return nil, fmt.Errorf("pin: %w", err)
	}
	if opts.Gateway == "" && opts.GatewayAddr == "" {
		return nil, errors.New("pin: gateway socket is required")
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("netns", path, "sandbox", opts.Identity.Sandbox, "agent", opts.Identity.Agent)

	// Hold the namespace open for the whole pin: a pid can be reused, the
	// file cannot change under us.
	ns, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("pin: open netns: %w", err)
	}
	p := &Pinned{NetNS: path, ns: ns}
	ok := false
	defer func() {
		if !ok {
			ns.Close()
		}
	}()
	if err := checkNetNS(ns); err != nil {
		return nil, err
	}
	if err := p.run(ctx, bytes.NewReader([]byte(Ruleset)), "nft", "-f", "-"); err != nil {
		return nil, fmt.Errorf("pin: load ruleset: %w", err)
	}
	if err := p.removeLinks(ctx, log); err != nil {
		return nil, err
	}
	if err := p.removeRoutes(ctx); err != nil {
		return nil, err
	}
	r, err := relay.Open(ctx, relay.Options{
		NetNS:       "/proc/self/fd/" + strconv.Itoa(int(ns.Fd())),
		Identity:    opts.Identity,
		Gateway:     opts.Gateway,
		GatewayAddr: opts.GatewayAddr,
		GatewayTLS:  opts.GatewayTLS,
		ProxyPort:   opts.ProxyPort,
		DNSPort:     opts.DNSPort,
		DNSCacheFor: opts.DNSCacheFor,
		Logger:      opts.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("pin: %w", err)
	}
	p.relay = r
	ok = true
	log.Info("pinned")
	return p, nil
}

func nsPath(opts Options) (string, error) {
	switch {
	case opts.NetNS != "" && opts.PID != 0:
		return "", errors.New("pin: set netns or pid, not both")
	case opts.NetNS != "":
		return opts.NetNS, nil
	case opts.PID > 0:
		return "/proc/" + strconv.Itoa(opts.PID) + "/ns/net", nil
	default:
		return "", errors.New("pin: netns path or pid is required")
	}
}

// checkNetNS refuses anything that is not a network namespace, and the
// namespace sandboxd runs in: pinning it would cut the host off.
func checkNetNS(ns *os.File) error {
	typ, err := unix.IoctlRetInt(int(ns.Fd()), unix.NS_GET_NSTYPE)
	if err != nil {
		return fmt.Errorf("pin: not a namespace: %w", err)
	}
	if typ != unix.CLONE_NEWNET {
		return errors.New("pin: not a network namespace")
	}
	var target unix.Stat_t
	if err := unix.Fstat(int(ns.Fd()), &target); err != nil {
		return fmt.Errorf("pin: stat netns: %w", err)
	}
	for _, own := range []string{"/proc/self/ns/net", "/proc/1/ns/net"} {
		var st unix.Stat_t
		var err error
		if own == "/proc/self/ns/net" {
			err = relay.OwnNetNS(&st) // the process's, not the main thread's
		} else {
			err = unix.Stat(own, &st)
		}
		if err != nil {
			// sandboxd's own namespace must be comparable; init's may
			// be hidden from it (a pid namespace, a restricted /proc).
			if own != "/proc/self/ns/net" && (errors.Is(err, unix.EACCES) || errors.Is(err, unix.ENOENT)) {
				continue
			}
			return fmt.Errorf("pin: stat %s: %w", own, err)
		}
		if st.Dev == target.Dev && st.Ino == target.Ino {
			return fmt.Errorf("pin: refusing to pin the host's own network namespace (%s)", own)
		}
	}
	return nil
}

// run runs argv inside the namespace with nsenter, passing the held
// namespace file as fd 3.
func (p *Pinned) run(ctx context.Context, stdin io.Reader, argv ...string) error {
	_, err := p.output(ctx, stdin, argv...)
	return err
}

func (p *Pinned) output(ctx context.Context, stdin io.Reader, argv ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", append([]string{"--net=/proc/self/fd/3", "--"}, argv...)...)
	cmd.ExtraFiles = []*os.File{p.ns}
	if stdin != nil {
		cmd.Stdin = stdin
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

type link struct {
	Name  string   `json:"ifname"`
	Flags []string `json:"flags"`
}

func (p *Pinned) links(ctx context.Context) ([]link, error) {
	out, err := p.output(ctx, nil, "ip", "-j", "link", "show")
	if err != nil {
		return nil, err
	}
	var ls []link
	if err := json.Unmarshal(out, &ls); err != nil {
		return nil, fmt.Errorf("ip link show: %w", err)
	}
	return ls, nil
}

// removeLinks deletes every interface but lo. An interface the kernel will
// not delete (a physical NIC, a tunnel module's fallback device) is taken
// down and stripped of addresses instead; Pin fails if one stays up.
func (p *Pinned) removeLinks(ctx context.Context, log *slog.Logger) error {
	ls, err := p.links(ctx)
	if err != nil {
		return fmt.Errorf("pin: list links: %w", err)
	}
	for _, l := range ls {
		if l.Name == "lo" {
			continue
		}
		if err := p.run(ctx, nil, "ip", "link", "del", "dev", l.Name); err != nil {
			// Deleting one end of a veth pair deletes the other: a
			// link that is gone by now needs nothing more.
			if now, lerr := p.links(ctx); lerr == nil && !hasLink(now, l.Name) {
				continue
			}
			log.Warn("pin: cannot delete link, taking it down", "link", l.Name, "err", err)
			if err := p.run(ctx, nil, "ip", "link", "set", "dev", l.Name, "down"); err != nil {
				return fmt.Errorf("pin: link %s: %w", l.Name, err)
			}
			if err := p.run(ctx, nil, "ip", "addr", "flush", "dev", l.Name); err != nil {
				return fmt.Errorf("pin: link %s: %w", l.Name, err)
			}
		}
	}
	ls, err = p.links(ctx)
	if err != nil {
		return fmt.Errorf("pin: list links: %w", err)
	}
	for _, l := range ls {
		if l.Name != "lo" && contains(l.Flags, "UP") {
			return fmt.Errorf("pin: link %s is still up", l.Name)
		}
	}
	return nil
}

func hasLink(ls []link, name string) bool {
	for _, l := range ls {
		if l.Name == name {
			return true
		}
	}
	return false
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

type route struct {
	Type  string `json:"type"`
	Dst   string `json:"dst"`
	Dev   string `json:"dev"`
	Table string `json:"table"`
}

// keep is the only kind of route a pinned namespace keeps: the kernel's own
// local-table routes on lo.
func (r route) keep() bool { return r.Table == "local" && r.Dev == "lo" }

// removeRoutes flushes every routing table but local, and removes local
// routes that are not on lo; then checks nothing else is left.
func (p *Pinned) removeRoutes(ctx context.Context) error {
	for _, fam := range []string{"-4", "-6"} {
		rs, err := p.routes(ctx, fam)
		if err != nil {
			return err
		}
		flushed := map[string]bool{}
		for _, r := range rs {
			switch {
			case r.keep():
			case r.Table != "local":
				if flushed[r.Table] {
					continue
				}
				flushed[r.Table] = true
				if err := p.run(ctx, nil, "ip", fam, "route", "flush", "table", r.Table); err != nil {
					return fmt.Errorf("pin: flush routes: %w", err)
				}
			default:
				args := []string{"ip", fam, "route", "del", "table", "local"}
				if r.Type != "" {
					args = append(args, "type", r.Type)
				}
				args = append(args, r.Dst)
				if r.Dev != "" {
					args = append(args, "dev", r.Dev)
				}
				if err := p.run(ctx, nil, args...); err != nil {
					return fmt.Errorf("pin: delete route: %w", err)
				}
			}
		}
		rs, err = p.routes(ctx, fam)
		if err != nil {
			return err
		}
		for _, r := range rs {
			if !r.keep() {
				return fmt.Errorf("pin: route %s %s dev %q table %s is left", r.Type, r.Dst, r.Dev, r.Table)
			}
		}
	}
	return nil
}

func (p *Pinned) routes(ctx context.Context, fam string) ([]route, error) {
	out, err := p.output(ctx, nil, "ip", fam, "-j", "route", "show", "table", "all")
	if err != nil {
		return nil, fmt.Errorf("pin: list routes: %w", err)
	}
	var rs []route
	if err := json.Unmarshal(out, &rs); err != nil {
		return nil, fmt.Errorf("pin: list routes: %w", err)
	}
	for i := range rs {
		if rs[i].Table == "" {
			rs[i].Table = "main"
		}
	}
	return rs, nil
}

// Reseal closes the pinned namespace again as Pin did (the ruleset
// reloaded, every interface but lo removed, every route off lo removed),
// keeping the listeners: a runtime that repeats a pod's network set-up
// may have put an interface back.
func (p *Pinned) Reseal(ctx context.Context, log *slog.Logger) error {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if err := p.run(ctx, bytes.NewReader([]byte(Ruleset)), "nft", "-f", "-"); err != nil {
		return fmt.Errorf("pin: reseal: load ruleset: %w", err)
	}
	if err := p.removeLinks(ctx, log); err != nil {
		return err
	}
	return p.removeRoutes(ctx)
}

// Verify checks that the namespace is still as Pin left it: the ruleset
// loaded with its three drop policies, no interface but lo up, and no
// route that leaves lo. It changes nothing (CNI CHECK asks it: a runtime
// or a process with CAP_NET_ADMIN inside may have added a link or route
// since). The first difference found is the error.
func (p *Pinned) Verify(ctx context.Context) error {
	out, err := p.output(ctx, nil, "nft", "list", "table", "inet", Table)
	if err != nil {
		return fmt.Errorf("pin: verify: ruleset: %w", err)
	}
	if n := strings.Count(string(out), "policy drop;"); n != 3 {
		return fmt.Errorf("pin: verify: ruleset: table inet %s has %d drop policies, want 3", Table, n)
	}
	ls, err := p.links(ctx)
	if err != nil {
		return fmt.Errorf("pin: verify: %w", err)
	}
	for _, l := range ls {
		if l.Name != "lo" && contains(l.Flags, "UP") {
			return fmt.Errorf("pin: verify: link %s is up", l.Name)
		}
	}
	for _, fam := range []string{"-4", "-6"} {
		rs, err := p.routes(ctx, fam)
		if err != nil {
			return fmt.Errorf("pin: verify: %w", err)
		}
		for _, r := range rs {
			if !r.keep() {
				return fmt.Errorf("pin: verify: route %s %s dev %q table %s", r.Type, r.Dst, r.Dev, r.Table)
			}
		}
	}
	return nil
}

// Close unpins: it closes the relay's listeners and every relayed
// connection. The nftables ruleset and the removed interfaces stay as they
// are, so the namespace stays closed (fail closed); the other runtime's
// teardown removes the namespace.
func (p *Pinned) Close() error {
	var err error
	if p.relay != nil {
		err = p.relay.Close()
	}
	if cerr := p.ns.Close(); cerr != nil && err == nil {
		err = fmt.Errorf("pin: close netns: %w", cerr)
	}
	return err
}
