package sandboxd

import (
	"errors"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/internal/yamlkeys"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"go.yaml.in/yaml/v3"
)

// Template is one named kind of sandbox (config templates.NAME): what a
// create naming it gets instead of the configured defaults, fixed on the
// host so that a caller choosing a template cannot change it. A create
// may still lower a limit (each one here is both its default and its
// ceiling), never raise it.
type Template struct {
	// Rootfs replaces the configured rootfs: its system folders are bound
	// read-only into the template's sandboxes (default: rootfs).
	Rootfs string `yaml:"rootfs"`
	// Limits are the template's defaults and ceilings; a zero field is the
	// configured limit, and none may be above it.
	Limits Limits `yaml:"limits"`
	// Egress narrows the agent's egress allowlist for every sandbox of the
	// template (as a create's egress does); a create naming the template
	// cannot set its own.
	Egress []string `yaml:"egress"`
	// Env is added to every command's environment; a create may not set
	// these keys.
	Env map[string]string `yaml:"env"`
}

// maxTemplates bounds templates: each may hold a mount template and a
// pool of its own.
const maxTemplates = 32

// templateName is what a template's name may be: 1 to 63 of [a-z0-9_-],
// starting with a letter or digit (it names a key path and a directory).
func templateName(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[0] == '_' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// checkTemplateKeys reports an unknown key under templates.NAME (the
// generic check does not walk maps) and rewrites sizes under each
// template's limits to byte counts.
func checkTemplateKeys(doc *yaml.Node) error {
	ts := child(doc, "templates")
	if ts == nil || ts.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(ts.Content); i += 2 {
		name, v := ts.Content[i].Value, ts.Content[i+1]
		if err := yamlkeys.Check(v, reflect.TypeOf(Template{}), "templates."+name); err != nil {
			return err
		}
		if err := sizeKeysIn(child(v, "limits"), "templates."+name+".limits"); err != nil {
			return err
		}
	}
	return nil
}

// validateTemplates checks templates and pool.per_template against c,
// each error naming its key.
func (c Config) validateTemplates() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Templates) > maxTemplates {
		bad("config: templates: at most %d, got %d", maxTemplates, len(c.Templates))
	}
	names := make([]string, 0, len(c.Templates))
	for n := range c.Templates {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		t, key := c.Templates[n], "templates."+n
		if !templateName(n) {
			bad("config: templates: name %q: want 1-63 of a-z, 0-9, - and _, starting with a letter or digit", n)
			continue
		}
		if t.Rootfs != "" && !filepath.IsAbs(t.Rootfs) {
			bad("config: %s.rootfs: must be an absolute path, got %q", key, t.Rootfs)
		}
		lim := t.Limits.Or(c.Limits)
		if err := lim.Validate(key + ".limits"); err != nil {
			errs = append(errs, err)
		} else if err := t.Limits.Within(c.Limits, "limits"); err != nil {
			var ce *CeilingError
			if errors.As(err, &ce) {
				bad("config: %s.limits.%s: %s is above %s (limits.%s): a template narrows the configured limits", key, ce.Limit, ce.Requested, ce.Ceiling, ce.Limit)
			} else {
				bad("config: %s.limits: %v", key, err)
			}
		}
		if t.Egress != nil {
			if _, err := wire.FormatEgress(t.Egress); err != nil {
				bad("config: %s.egress: %v", key, err)
			}
		}
		for _, k := range sortedKeys(t.Env) {
			if v := t.Env[k]; !envKey.MatchString(k) || reservedEnv[k] || len(v) > 32<<10 || strings.IndexByte(v, 0) >= 0 {
				bad("config: %s.env: %q is not a variable a template may set", key, k)
			}
		}
	}
	total := c.Pool.Size + c.Spares
	for _, n := range sortedKeys(c.Pool.PerTemplate) {
		k := c.Pool.PerTemplate[n]
		switch _, ok := c.Templates[n]; {
		case !ok:
			bad("config: pool.per_template.%s: no template %q (templates names %s)", n, n, strings.Join(names, ", "))
		case k < 0 || k > 64:
			bad("config: pool.per_template.%s: must be in 0..64, got %d", n, k)
		}
		total += max(k, 0)
	}
	if total > 0 && total >= c.UIDs.Count {
		bad("config: pool.per_template: the pools hold %d sandboxes in all, which must stay below uids.count (%d)", total, c.UIDs.Count)
	}
	return errors.Join(errs...)
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}

// envKey matches a valid variable name: [A-Za-z_][A-Za-z0-9_] of at most
// 128 bytes. It is not a regexp: this package's initialisation runs in
// every sandbox's init too, and compiling one there costs start-up time.
var envKey envName

type envName struct{}

// MatchString reports whether k is a valid variable name.
func (envName) MatchString(k string) bool {
	if k == "" || len(k) > 128 {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || i > 0 && c >= '0' && c <= '9' {
			continue
		}
		return false
	}
	return true
}

// reservedEnv are set by sandboxd and cannot be overridden.
var reservedEnv = map[string]bool{
	"HTTP_PROXY": true, "HTTPS_PROXY": true, "http_proxy": true, "https_proxy": true,
	"NO_PROXY": true, "no_proxy": true, "SLUICE_URL": true, "SLUICE_SANDBOX": true, "SLUICE_MCP_URL": true,
}
