package sandboxd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Exec runs one command in the sandbox and waits for it, its output
// capped, its wall clock bounded. Commands in one sandbox run one at a
// time. A timeout (or ctx ending) kills every process in the sandbox but
// its init, so nothing the command started is left running.
func (m *Manager) Exec(ctx context.Context, id string, req ExecRequest) (ExecResult, error) {
	sb, err := m.get(id)
	if err != nil {
		return ExecResult{}, err
	}
	if len(req.Argv) == 0 || len(req.Argv) > 4096 {
		return ExecResult{}, fmt.Errorf("%w: argv must have 1..4096 entries", ErrInvalid)
	}
	for _, a := range req.Argv {
		if bytes.IndexByte([]byte(a), 0) >= 0 {
			return ExecResult{}, fmt.Errorf("%w: argv contains NUL", ErrInvalid)
		}
	}
	if err := checkEnv(req.Env); err != nil {
		return ExecResult{}, err
	}
	// The sandbox's own limits are the exec's ceilings (they are at most
	// sandboxd.yaml's): refused, not capped (THREATS B8).
	if err := (Limits{ExecTimeout: req.Timeout, OutputBytes: req.OutputBytes}).Within(sb.info.Limits, "the sandbox's limits"); err != nil {
		m.refuseLimit(sb.info.Agent, id, err)
		return ExecResult{}, fmt.Errorf("sandboxd: exec: %w", err)
	}
	timeout, limit := req.Timeout, req.OutputBytes
	if timeout <= 0 {
		timeout = sb.info.Limits.ExecTimeout
	}
	if limit <= 0 {
		limit = sb.info.Limits.OutputBytes
	}
	m.touch() // and once it ends: refills wait for a quiet moment
	defer m.touch()
	sb.execMu.Lock()
	defer sb.execMu.Unlock()
	if sb.dead.Load() {
		return ExecResult{}, fmt.Errorf("sandboxd: exec: sandbox %s: %w: its init has exited", id, ErrFailed)
	}
	start := time.Now()

	var closers []io.Closer
	defer func() {
		for _, c := range closers {
			c.Close()
		}
	}()
	// Child ends go to init; ours stay here.
	var childFDs [3]*os.File
	if f, ok := req.Stdin.(*os.File); ok {
		childFDs[0] = f
	} else if req.Stdin == nil {
		// Empty input: the host's /dev/null, read-only (no pipe, no
		// goroutine to feed it).
		f, err := os.Open(os.DevNull)
		if err != nil {
			return ExecResult{}, fmt.Errorf("sandboxd: exec: %w", err)
		}
		childFDs[0] = f
		closers = append(closers, f)
	} else {
		r, w, err := os.Pipe()
		if err != nil {
			return ExecResult{}, fmt.Errorf("sandboxd: exec: %w", err)
		}
		childFDs[0] = r
		closers = append(closers, r)
		go func() {
			_, _ = io.Copy(w, req.Stdin)
			w.Close()
		}()
	}
	var res ExecResult
	var outBuf, errBuf bytes.Buffer
	outs := []*capWriter{
		{w: req.Stdout, buf: &outBuf, limit: limit},
		{w: req.Stderr, buf: &errBuf, limit: limit},
	}
	var readers []*os.File
	var wg sync.WaitGroup
	for i, cw := range outs {
		r, w, err := os.Pipe()
		if err != nil {
			return ExecResult{}, fmt.Errorf("sandboxd: exec: %w", err)
		}
		childFDs[i+1] = w
		closers = append(closers, w)
		readers = append(readers, r)
		wg.Add(1)
		go func() {
			defer wg.Done()
			bp := copyBufs.Get().(*[]byte)
			defer copyBufs.Put(bp)
			// Hide File.WriteTo: it would allocate its own buffer.
			_, _ = io.CopyBuffer(cw, struct{ io.Reader }{r}, *bp)
		}()
	}
	defer func() {
		for _, r := range readers {
			r.Close()
		}
	}()
	oom0, pids0 := sb.cg.counters()
	err = sb.ctl.send(execMsg{Argv: req.Argv, Env: append(append([]string(nil), sb.env...), envList(req.Env)...), Dir: "/workspace"},
		int(childFDs[0].Fd()), int(childFDs[1].Fd()), int(childFDs[2].Fd()))
	// Our copies of the child ends must close now, or the readers never
	// see EOF.
	for _, c := range closers {
		c.Close()
	}
	closers = nil
	if err != nil {
		m.markDead(sb)
		return ExecResult{}, fmt.Errorf("sandboxd: exec: %w", err)
	}
	var rep replyMsg
	if _, err := sb.ctl.recv(&rep); err != nil {
		m.markDead(sb)
		return ExecResult{}, fmt.Errorf("sandboxd: exec: %w", err)
	}
	if rep.Error != "" {
		res.ExitCode = 127
		res.Stderr = rep.Error + "\n"
		if req.Stderr != nil {
			// Streamed: the caller's stderr must say why nothing ran
			// (the copiers have seen EOF: init closed the command's ends).
			wg.Wait()
			_, _ = io.WriteString(req.Stderr, "sandboxd: "+res.Stderr)
		}
		if _, pids1 := sb.cg.counters(); pids1 > pids0 {
			res.KilledBy = KilledByPids
		}
		return res, nil
	}
	// Wall clock: kill everything but init; init then reports the exit.
	timedOut := make(chan struct{})
	var once sync.Once
	kill := func() { once.Do(func() { close(timedOut); sb.cg.killAllBut(sb.info.Pid) }) }
	timer := time.AfterFunc(timeout, kill)
	stop := context.AfterFunc(ctx, kill)
	_ = sb.ctl.c.SetReadDeadline(time.Now().Add(timeout + 30*time.Second))
	_, err = sb.ctl.recv(&rep)
	_ = sb.ctl.c.SetReadDeadline(time.Time{})
	timer.Stop()
	stop()
	died := err != nil
	if died {
		m.markDead(sb)
		res.ExitCode, res.Signal = 137, int(unix.SIGKILL)
	} else {
		res.ExitCode, res.Signal = rep.Code, rep.Signal
	}
	// Background processes may hold the pipes open: give the output a
	// moment to drain, then stop reading.
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(200 * time.Millisecond):
		for _, r := range readers {
			r.Close()
		}
		<-done
	}
	oom1, pids1 := sb.cg.counters()
	select {
	case <-timedOut:
		res.KilledBy = KilledByTimeout
	default:
		switch {
		case oom1 > oom0:
			res.KilledBy = KilledByOOM
		case pids1 > pids0:
			res.KilledBy = KilledByPids
		}
	}
	res.Stdout, res.Stderr = outBuf.String(), errBuf.String()
	res.Truncated = outs[0].truncated || outs[1].truncated
	res.Millis = time.Since(start).Milliseconds()
	code := res.ExitCode
	m.events.write(event{Event: "exec", Sandbox: id, Agent: sb.info.Agent, Session: sb.info.Session,
		Argv0: req.Argv[0], ExitCode: &code, KilledBy: res.KilledBy, Millis: res.Millis})
	if res.KilledBy != KilledByNone {
		name := map[KilledBy]string{KilledByOOM: "oom", KilledByPids: "pids_limit", KilledByTimeout: "timeout"}[res.KilledBy]
		m.events.write(event{Event: name, Sandbox: id, Agent: sb.info.Agent, Session: sb.info.Session, Argv0: req.Argv[0]})
		limit := map[KilledBy]int64{KilledByOOM: sb.info.Limits.MemoryBytes, KilledByPids: int64(sb.info.Limits.Pids),
			KilledByTimeout: timeout.Milliseconds()}[res.KilledBy]
		m.reportEvent(sb, name, limit) // gateway_admin_linux.go
	}
	if died {
		return res, fmt.Errorf("sandboxd: exec: sandbox %s: %w: its init has exited", id, ErrFailed)
	}
	return res, nil
}

// copyBufs are the buffers Exec copies a command's output with.
var copyBufs = sync.Pool{New: func() any {
	b := make([]byte, 32<<10)
	return &b
}}

func (m *Manager) markDead(sb *sandbox) {
	sb.dead.Store(true)
	m.log.Warn("sandbox init exited", "sandbox", sb.info.ID)
}

func envList(env map[string]string) []string {
	var out []string
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// capWriter passes through at most limit bytes, then writes the marker
// once and discards the rest (still reading, so the writer is not blocked
// or killed by SIGPIPE: its behaviour does not depend on the cap).
type capWriter struct {
	w         io.Writer // nil = buf
	buf       *bytes.Buffer
	limit     int
	n         int
	truncated bool
	failed    bool
}

func (c *capWriter) Write(p []byte) (int, error) {
	total := len(p)
	if c.truncated || c.failed {
		return total, nil
	}
	out := c.w
	if out == nil {
		out = c.buf
	}
	if room := c.limit - c.n; len(p) > room {
		p = p[:room]
		c.truncated = true
	}
	c.n += len(p)
	if _, err := out.Write(p); err != nil {
		c.failed = true
		return total, nil
	}
	if c.truncated {
		_, _ = io.WriteString(out, TruncatedMarker)
	}
	return total, nil
}
