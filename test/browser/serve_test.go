package browser

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// buildSluice builds the real binary once for the test process.
var buildSluice = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "sluice-brbin-")
	if err != nil {
		return "", err
	}
	return gwenv.Build(dir)
})

// serveProc is `sluice serve --config config` run by a test on the
// host's loopback (its admin listener at admin), its log in log.
type serveProc struct {
	t      *testing.T
	config string
	admin  string
	log    io.Writer
	cmd    *exec.Cmd
	cancel context.CancelFunc // ends the process: SIGTERM, SIGKILL after 15s
	exited chan struct{}
}

// startServe starts the binary and waits until /readyz answers 200; the
// process is stopped when the test ends.
func startServe(t *testing.T, config, admin string, log io.Writer) *serveProc {
	t.Helper()
	g := &serveProc{t: t, config: config, admin: admin, log: log}
	g.start()
	t.Cleanup(g.stop)
	return g
}

func (g *serveProc) start() {
	g.t.Helper()
	bin, err := buildSluice()
	if err != nil {
		g.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g.cmd = exec.CommandContext(ctx, bin, "serve", "--config", g.config, "--log-level", "debug", "--log-flush", "0")
	g.cmd.Stdout, g.cmd.Stderr = g.log, g.log
	g.cmd.Cancel = func() error { return g.cmd.Process.Signal(syscall.SIGTERM) }
	g.cmd.WaitDelay = 15 * time.Second
	if err := g.cmd.Start(); err != nil {
		cancel()
		g.t.Fatalf("start sluice serve: %v", err)
	}
	exited := make(chan struct{})
	g.cancel, g.exited = cancel, exited
	go func() { _ = g.cmd.Wait(); close(exited) }()
	c := &http.Client{Timeout: 2 * time.Second}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		select {
		case <-exited:
			g.t.Fatalf("sluice serve exited: %v", g.cmd.ProcessState)
		default:
		}
		if resp, err := c.Get("http://" + g.admin + "/readyz"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			g.t.Fatal("sluice serve not ready after 60s")
		}
	}
}

// stop ends the process and waits for it.
func (g *serveProc) stop() {
	if g.cancel != nil {
		g.cancel()
		<-g.exited
	}
}

// restart stops the process and starts it again on the same
// configuration (its memory, such as cached tokens, is gone; its store,
// secrets and audit log stay).
func (g *serveProc) restart() {
	g.t.Helper()
	g.stop()
	g.start()
}
