package sandboxd

import (
	"errors"
	"fmt"
	"maps"
	"slices"
)

// applyTemplate gives req what its template fixes: the template's egress
// (a request may not set its own) and env (a request may not set those
// keys). The template's limits are applied by Create as the request's
// defaults and ceilings. An unknown template is refused before anything
// is built, and recorded (event template_refused).
func (m *Manager) applyTemplate(req CreateRequest) (CreateRequest, error) {
	name := req.Template
	t, ok := m.cfg.Templates[name]
	if !ok {
		if len(name) > 64 {
			name = name[:64] + "…"
		}
		err := fmt.Errorf("%w: template %q is not configured (sandboxd.yaml templates)", ErrInvalid, name)
		m.events.write(event{Event: "template_refused", Agent: req.Agent, Session: req.Session, User: req.User, Error: err.Error()})
		return req, err
	}
	if t.Egress != nil {
		if req.Egress != nil {
			return req, fmt.Errorf("%w: egress is fixed by template %q (sandboxd.yaml templates.%s.egress)", ErrInvalid, name, name)
		}
		req.Egress = slices.Clone(t.Egress)
	}
	if len(t.Env) > 0 {
		env := maps.Clone(t.Env)
		for k, v := range req.Env {
			if _, fixed := t.Env[k]; fixed {
				return req, fmt.Errorf("%w: env %q is fixed by template %q (sandboxd.yaml templates.%s.env)", ErrInvalid, k, name, name)
			}
			env[k] = v
		}
		req.Env = env
	}
	return req, nil
}

// templateLimits are the defaults and ceilings of template's sandboxes
// ("": the configured limits).
func (m *Manager) templateLimits(template string) Limits {
	if template == "" {
		return m.cfg.Limits
	}
	return m.cfg.Templates[template].Limits.Or(m.cfg.Limits)
}

// rootfsOf is the rootfs of template's sandboxes.
func (m *Manager) rootfsOf(template string) string {
	if t := m.cfg.Templates[template].Rootfs; template != "" && t != "" {
		return t
	}
	return m.cfg.Rootfs
}

// closePools empties every pool: its sandboxes are torn down, or, with
// kept (on_stop keep), released for the next sandboxd to re-adopt into
// its pool (their state files stay).
func (m *Manager) closePools(kept bool) error {
	var errs []error
	for _, p := range m.pools {
		for len(p.spares) > 0 {
			sb := <-p.spares
			if kept && !sb.dead.Load() && m.cfg.AdoptWait > 0 {
				errs = append(errs, m.releaseSandbox(sb))
				continue
			}
			errs = append(errs, m.teardown(sb, false))
		}
	}
	return errors.Join(errs...)
}
