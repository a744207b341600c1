//go:build linux

package attack

import (
	"context"
	"io"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/sluice-gw/sluice/sandboxd"
	"github.com/sluice-gw/sluice/sandboxd/relay"
)

// benchManager is an in-process Manager whose init is the built sandboxd
// binary, with the real relay as every sandbox's exit.
func benchManager(b *testing.B, spares int) *sandboxd.Manager {
	b.Helper()
	if skipWhy != "" {
		b.Skip(skipWhy)
	}
	st := stateDir(b)
	cfg := sandboxd.Default()
	cfg.StateDir = filepath.Join(st, "state")
	cfg.Gateway = filepath.Join(st, "gw.sock")
	cfg.Spares = spares
	m, err := sandboxd.New(sandboxd.Options{Config: cfg, InitPath: bin,
		Exits: func(ctx context.Context, e sandboxd.Exit) (io.Closer, error) {
			return relay.Open(ctx, relay.Options{NetNS: e.NetNS, Identity: e.Identity, Gateway: e.Gateway,
				SocketPath: e.SocketPath, ProxyPort: e.ProxyPort, DNSPort: e.DNSPort})
		}})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { m.Close() })
	return m
}

// BenchmarkCreateExecDestroy: a fresh fully isolated sandbox per /bin/true
// (namespaces, root, seccomp, Landlock, cgroups, relay listeners) against
// bwrap --unshare-all.
func BenchmarkCreateExecDestroy(b *testing.B) {
	for _, spares := range []int{0, 1} {
		b.Run("sandboxd/spares="+strconv.Itoa(spares), func(b *testing.B) { createExecDestroy(b, benchManager(b, spares)) })
	}
	b.Run("bwrap", func(b *testing.B) {
		bw, err := exec.LookPath("bwrap")
		if err != nil {
			b.Skip("bwrap not installed (Debian package bubblewrap)")
		}
		for b.Loop() {
			if err := exec.Command(bw, "--unshare-all", "--ro-bind", "/", "/", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func createExecDestroy(b *testing.B, m *sandboxd.Manager) {
	ctx := context.Background()
	for b.Loop() {
		in, err := m.Create(ctx, sandboxd.CreateRequest{Agent: "bench"})
		if err != nil {
			b.Fatal(err)
		}
		res, err := m.Exec(ctx, in.ID, sandboxd.ExecRequest{Argv: []string{"/bin/true"}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec: %v %+v", err, res)
		}
		if err := m.Destroy(in.ID); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExec: /bin/true in a running sandbox against nsenter into the
// same sandbox's namespaces.
func BenchmarkExec(b *testing.B) {
	m := benchManager(b, 0)
	ctx := context.Background()
	in, err := m.Create(ctx, sandboxd.CreateRequest{Agent: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("sandboxd", func(b *testing.B) {
		for b.Loop() {
			res, err := m.Exec(ctx, in.ID, sandboxd.ExecRequest{Argv: []string{"/bin/true"}})
			if err != nil || res.ExitCode != 0 {
				b.Fatalf("exec: %v %+v", err, res)
			}
		}
	})
	b.Run("nsenter", func(b *testing.B) {
		ns, err := exec.LookPath("nsenter")
		if err != nil {
			b.Skip("nsenter not installed (util-linux)")
		}
		for b.Loop() {
			if err := exec.Command(ns, "-t", strconv.Itoa(in.Pid), "-a", "/bin/true").Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
}
