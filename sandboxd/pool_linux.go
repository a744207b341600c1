package sandboxd

import (
	"context"
	"os"
	"time"
)

// warmPool holds sandboxes built ahead for one template ("" = none): each
// a complete sandbox (fresh namespaces, its own uid range, cgroup and
// root, confined) built with the template's limits and rootfs, waiting
// only for its exits and its owner. A create rewrites the cgroup limits
// and opens the exits; a pooled sandbox serves one sandbox and is never
// reused.
type warmPool struct {
	template string
	lim      Limits // what its sandboxes are built with
	spares   chan *sandbox
	// builders run refill for the pool; building is how many sandboxes
	// they are making (both under Manager.mu).
	builders, building int
}

// newPools makes the pool of sandboxes without a template (size spares)
// and one per template pool.per_template names.
func (m *Manager) newPools() {
	m.pools = map[string]*warmPool{}
	if n := m.cfg.Spares; n > 0 {
		m.pools[""] = &warmPool{lim: m.cfg.Limits, spares: make(chan *sandbox, n)}
	}
	for name, n := range m.cfg.Pool.PerTemplate {
		if n > 0 {
			m.pools[name] = &warmPool{template: name, lim: m.templateLimits(name), spares: make(chan *sandbox, n)}
		}
	}
}

// pooled is how many sandboxes every pool holds at most, together.
func (c Config) pooled() int {
	n := c.Spares
	for _, k := range c.Pool.PerTemplate {
		n += max(k, 0)
	}
	return n
}

// fits reports whether a sandbox of p can serve lim: the sizes of its
// tmpfs mounts are fixed when it is built; the cgroup limits are
// rewritten when it is taken.
func (p *warmPool) fits(lim Limits) bool {
	return lim.WorkspaceBytes == p.lim.WorkspaceBytes && lim.TmpBytes == p.lim.TmpBytes
}

// takeSpare returns a sandbox of template's pool that fits lim, or nil. It
// never waits: a create that finds the pool empty forks its own, at once,
// rather than queue behind a refill (whose sandboxes are spread over
// later creates).
func (m *Manager) takeSpare(template string, lim Limits) *sandbox {
	p := m.pools[template]
	if p == nil || !p.fits(lim) {
		return nil
	}
	for {
		select {
		case sb := <-p.spares:
			if sb.dead.Load() { // its init died while it waited
				_ = m.teardown(sb, true)
				continue
			}
			return sb
		default:
			return nil
		}
	}
}

// refillQuiet is how long a refill waits after the last create ended
// (with none running), and after an exec began or ended, before it
// builds: a burst of creates is served first (from the pool, or each by
// its own fork), with the commands run in them right after, and the
// refill's forks do not take CPU from them.
const refillQuiet = 20 * time.Millisecond

// startRefills starts a refill of every pool that is not full.
func (m *Manager) startRefills() {
	for _, p := range m.pools {
		m.startRefill(p)
	}
}

// startRefill starts builders for p (at most refillBuilders) while it
// lacks sandboxes no builder is making, unless the manager is closed.
func (m *Manager) startRefill(p *warmPool) {
	if p == nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	for !m.closed && p.builders < refillBuilders && len(p.spares)+p.building < cap(p.spares) {
		p.builders++
		m.refills.Add(1)
		go func() {
			defer m.refills.Done()
			m.refill(p)
		}()
	}
}

// touch records activity a refill should not compete with.
func (m *Manager) touch() {
	m.mu.Lock()
	m.lastCreate = time.Now()
	m.mu.Unlock()
}

// refillQuietMax bounds how long a refill waits for a quiet moment: under
// creates that never pause the pool still refills.
const refillQuietMax = time.Second

// quiet waits until no create runs and none has for refillQuiet (at most
// refillQuietMax); false when the manager closed meanwhile.
func (m *Manager) quiet() bool {
	for start := time.Now(); time.Since(start) < refillQuietMax; {
		m.mu.Lock()
		closed, last, busy := m.closed, m.lastCreate, m.inCreate > 0
		m.mu.Unlock()
		if closed {
			return false
		}
		d := refillQuiet - time.Since(last)
		if busy {
			d = refillQuiet
		}
		if d <= 0 {
			return true
		}
		select {
		case <-time.After(d):
		case <-m.closing:
			return false
		}
	}
	return true
}

// refill is one of p's builders: it builds one sandbox at a time until
// p holds or is being given cap(p.spares). Builders are pipelined (each
// starts its next build as soon as its last is in the pool, not when the
// other's is), sandboxd forks from refillBuilders threads. A build that
// fails is retried after a pause that doubles up to refillBackoffMax: a
// pool left empty by one failure would put every create back on the fork
// path until the next create happened to restart the refill.
func (m *Manager) refill(p *warmPool) {
	backoff := refillBackoff
	defer func() {
		m.mu.Lock()
		p.builders--
		m.mu.Unlock()
	}()
	for {
		if !m.quiet() {
			return
		}
		if m.refillRate != nil {
			_ = m.refillRate.Wait(context.Background())
		}
		m.mu.Lock()
		if m.closed || len(p.spares)+p.building >= cap(p.spares) {
			m.mu.Unlock()
			return
		}
		p.building++
		m.mu.Unlock()
		sb, err := m.fork(p.lim, p.template)
		if err == nil {
			if err = m.setup(sb, nil); err != nil {
				m.teardown(sb, false)
			}
		}
		if err == nil {
			m.saveSpare(sb)
			p.spares <- sb // building reserved its room
		}
		m.mu.Lock()
		p.building--
		m.mu.Unlock()
		if err == nil {
			backoff = refillBackoff
			continue
		}
		m.log.Warn("sandboxd: pool", "template", p.template, "err", err, "retry_in", backoff)
		select {
		case <-time.After(backoff):
		case <-m.closing:
			return
		}
		backoff = min(2*backoff, refillBackoffMax)
	}
}

// refillBuilders is how many pooled sandboxes refill builds at once.
const refillBuilders = 2

// The pause after a failed pool build, and its ceiling.
const (
	refillBackoff    = 100 * time.Millisecond
	refillBackoffMax = 10 * time.Second
)

// readoptSpare puts a pooled sandbox a previous sandboxd left back into
// its template's pool (event spare_readopted). One whose init died is
// cleaned up (spare_lost); one no pool wants any more (the pool is gone
// or full, or its template's limits changed) is destroyed
// (spare_discarded). A spare has no identity: nothing is reported to the
// gateway.
func (m *Manager) readoptSpare(r boxRecord) {
	p := m.pools[r.Info.Template]
	why := ""
	switch {
	case p == nil:
		why = "no pool of its template is configured"
	case r.Info.Limits != p.lim:
		why = "its template's limits changed"
	case len(p.spares) == cap(p.spares):
		why = "its pool is full"
	}
	sb, err := m.adoptInit(r)
	if err != nil {
		m.log.Warn("pooled sandbox lost across the restart", "sandbox", r.Info.ID, "pid", r.Info.Pid, "err", err)
		m.events.write(event{Event: "spare_lost", Sandbox: r.Info.ID, Pid: r.Info.Pid, Error: err.Error()})
		lost := &sandbox{info: r.Info, slot: -1, dir: r.Dir, cg: &cgroup{v2: r.CG.V2, dirs: r.CG.Dirs, files: map[string]*os.File{}}}
		lost.cg.killAllBut(-1)
		_ = m.cleanup(lost)
		return
	}
	if why != "" {
		m.events.write(event{Event: "spare_discarded", Sandbox: r.Info.ID, Pid: r.Info.Pid, Error: why})
		_ = m.teardown(sb, false)
		return
	}
	if err := m.watchAdopted(sb); err != nil {
		m.log.Warn("re-adopted pooled sandbox's init is not watched", "sandbox", r.Info.ID, "err", err)
	}
	p.spares <- sb // New runs this before any refill: there is room (checked above)
	m.events.write(event{Event: "spare_readopted", Sandbox: r.Info.ID, Pid: r.Info.Pid})
	m.log.Info("pooled sandbox re-adopted", "sandbox", r.Info.ID, "template", r.Info.Template, "pid", r.Info.Pid)
}
