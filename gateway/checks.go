package gateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net/netip"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/policylife"
	"github.com/sluice-gw/sluice/policy"
)

// Findings are the problems Check found in a configuration: Errors make
// `sluice validate` fail (serve refuses most of them too); Warnings are
// printed and do not. Connectors are the specs Check loaded (in config
// order; one whose spec did not load is missing and has an error), and
// Modules the number of the security team's Rego modules, so that
// validate reports on what it checked without loading anything twice.
type Findings struct {
	Errors     []error
	Warnings   []error
	Connectors []*connectors.Connector
	Modules    int
}

// CheckOptions say how Check loads: Strict makes every connector's spec
// load all-or-nothing (validate --strict), Defects also reports defects
// outside the operations (what validate shows; serve does not pay for it).
type CheckOptions struct {
	Logger  *slog.Logger
	Strict  bool
	Defects bool
}

// specLoad is what CheckOptions add to each connector's load.
type specLoad struct{ strict, defects bool }

// loadCatalog loads the catalog as serve does.
func loadCatalog(ctx context.Context, cfg *config.Config, d *guard.Dialer) (*catalog, []error, error) {
	return loadCatalogWith(ctx, cfg, d, specLoad{})
}

// PolicyConfig is the policy configuration serve compiles from cfg: the
// simple rules (policies[i] keeps its index as its rule name), the Rego
// paths, the agents' egress allowlists and the CONNECT ports. Check,
// `sluice policy eval` and `sluice policy test --with-config` use it, so
// that they decide and test what serve decides.
func PolicyConfig(cfg *config.Config, log *slog.Logger) policy.Config {
	rules := make([]policy.Rule, len(cfg.Policies))
	for i, p := range cfg.Policies {
		rules[i] = policy.Rule{Match: p.Match, Action: p.Action, Approvers: p.Approvers, Reason: p.Reason}
	}
	return policy.Config{Rules: rules, Paths: cfg.Rego, Egress: egressAllowlists(cfg), ConnectPorts: cfg.Egress.ConnectPorts, Logger: log,
		Bundle: policylife.BundleConfig(cfg)}
}

// egressAllowlists maps each agent to its agents[].egress list for policy.
func egressAllowlists(cfg *config.Config) map[string][]string {
	m := make(map[string][]string, len(cfg.Agents))
	for _, a := range cfg.Agents {
		m[a.Name] = a.Egress
	}
	return m
}

// Check loads every spec (once), decides how each credential is attached,
// compiles the Rego and checks the modules (policy.Check), checks every
// secret reference, and checks what would fail at runtime
// (upstreamProblems, askProblems); it returns every problem found, each
// naming its config key or file:line. It writes nothing and listens on
// nothing.
func Check(ctx context.Context, cfg *config.Config, opts CheckOptions) Findings {
	var f Findings
	cat, warns, err := loadCatalogWith(ctx, cfg, guard.New(guard.Options{}), specLoad{strict: opts.Strict, defects: opts.Defects})
	if err != nil {
		f.Errors = append(f.Errors, err)
	}
	f.Warnings = append(f.Warnings, warns...)
	listed, rwarns := checkRemotes(ctx, cfg, cat) // mcp_remote.go: remote MCP servers' tools
	f.Warnings = append(f.Warnings, rwarns...)
	for _, cc := range cfg.Connectors {
		if conn := listed[cc.Slug]; conn != nil {
			f.Connectors = append(f.Connectors, conn)
		} else if up := cat.connectors[cc.Slug]; up != nil {
			f.Connectors = append(f.Connectors, up.conn)
		}
	}
	for i, p := range cfg.Policies {
		if slug, _, _ := strings.Cut(p.Match, "."); cat.remotes[slug] != nil {
			if conn := listed[slug]; conn != nil && !strings.ContainsAny(p.Match, "*?") && !slices.ContainsFunc(conn.Tools, func(t *connectors.Tool) bool { return t.Name == p.Match }) {
				f.Warnings = append(f.Warnings, warnf("policies[%d].match: the remote MCP server %s lists no tool named %q now", i, slug, p.Match))
			}
			continue // a remote's tools are known only once it is listed
		}
		if !strings.ContainsAny(p.Match, "*?") {
			if _, ok := cat.tools[p.Match]; !ok && err == nil {
				f.Errors = append(f.Errors, fmt.Errorf("policies[%d].match: no tool is named %q", i, p.Match))
			}
		}
	}
	if _, perr := policy.New(ctx, PolicyConfig(cfg, opts.Logger)); perr != nil {
		f.Errors = append(f.Errors, fmt.Errorf("rego: %w", perr))
	} else if lint, lerr := policy.Check(ctx, cfg.Rego); lerr != nil {
		f.Errors = append(f.Errors, fmt.Errorf("rego: %w", lerr))
	} else {
		f.Modules = lint.Modules
		for _, p := range lint.Errors {
			f.Errors = append(f.Errors, fmt.Errorf("rego: %s", p))
		}
		for _, p := range lint.Warnings {
			f.Warnings = append(f.Warnings, fmt.Errorf("rego: %s", p))
		}
	}
	if cfg.Gateway.RelayTLS.Listen != "" {
		if _, err := ingress.RelayTLSConfig(cfg.Gateway.RelayTLS); err != nil {
			f.Errors = append(f.Errors, err)
		}
	}
	f.Errors = append(f.Errors, creds.CheckRefs(ctx, cfg)...)
	f.Errors = append(f.Errors, extAuthzProblems(cfg)...) // extauthz_door.go
	f.Errors = append(f.Errors, hostedProblems(cfg)...)   // hosted_door.go
	f.Errors = append(f.Errors, egress.Validate(cfg)...)
	f.add(upstreamProblems(cfg, cat))
	f.add(askProblems(cfg))
	return f
}

// add files each problem as an error, or as a warning when it is a *warning.
func (f *Findings) add(ps []error) {
	for _, p := range ps {
		var w *warning
		if errors.As(p, &w) {
			f.Warnings = append(f.Warnings, p)
		} else {
			f.Errors = append(f.Errors, p)
		}
	}
}

// warning is a problem `sluice validate` prints without failing: the
// configuration works, but not as intended or not as narrowly as it could.
type warning struct{ msg string }

func (w *warning) Error() string { return w.msg }

func warnf(format string, args ...any) error { return &warning{fmt.Sprintf(format, args...)} }

// upstreamProblems checks each loaded connector's destination against its
// allow_private, as the guard will at every call: a base_url at an address
// the guard refuses (loopback, private, link-local … with no allow_private
// entry covering it; metadata, multicast or unspecified whatever
// allow_private says) is an error, since every call to it will be refused;
// an allow_private entry wider than the base URL needs, or that it does not
// need at all, is a warning naming the narrower prefix. Only an address
// literal (or localhost) can be judged here: a name is resolved and checked
// per call. serve logs these and runs: the guard refuses such calls with
// 403 egress_denied, by design.
func upstreamProblems(cfg *config.Config, cat *catalog) []error {
	if cat == nil {
		return nil
	}
	var out []error
	for i, cc := range cfg.Connectors {
		up := cat.connectors[cc.Slug]
		if up == nil || up.conn.BaseURL == nil {
			continue
		}
		k := fmt.Sprintf("connectors[%d]", i)
		where := k + ".base_url"
		switch {
		case cc.Provider == "mcp":
			where = k + ".url"
		case cc.BaseURL == "":
			where = k + ".spec (its servers' first url)"
		}
		host := up.conn.BaseURL.Hostname()
		a, err := netip.ParseAddr(host)
		if err != nil {
			if guard.NameClass(host) == guard.Public {
				continue // a name: classified per call, after resolution
			}
			if c := guard.NameClass(host); !c.Allowable() {
				out = append(out, fmt.Errorf("%s: %s is a %s name: the guard refuses every call to it, whatever allow_private says", where, host, c))
			} else if len(up.allow) == 0 {
				out = append(out, fmt.Errorf("%s: %s is a %s name and the connector has no allow_private: the guard refuses every call; use 127.0.0.1 and allow_private [127.0.0.1/32] if this API is meant to be on this host", where, host, c))
			}
			continue
		}
		a = a.WithZone("").Unmap()
		c := guard.Classify(a)
		host1 := netip.PrefixFrom(a, a.BitLen())
		switch {
		case c == guard.Public:
			for j, p := range cc.AllowPrivate {
				out = append(out, warnf("%s.allow_private[%d]: %s is not needed: the base URL's address %s is public (remove the entry)", k, j, p, a))
			}
			continue
		case !c.Allowable():
			out = append(out, fmt.Errorf("%s: %s is a %s address: the guard refuses every call to it, whatever allow_private says", where, a, c))
			continue
		case !guard.Admitted(c, a, up.allow):
			out = append(out, fmt.Errorf("%s: %s is a %s address and no connectors[%d].allow_private entry covers it: the guard refuses every call; add %s to allow_private if this API is meant to be internal", where, a, c, i, host1))
		}
		for j, p := range up.allow {
			switch {
			case !p.Contains(a):
				out = append(out, warnf("%s.allow_private[%d]: %s does not cover the base URL's address %s: it admits nothing this connector dials (remove it, or use %s)", k, j, cc.AllowPrivate[j], a, host1))
			case p.Bits() < a.BitLen():
				out = append(out, warnf("%s.allow_private[%d]: %s admits %s addresses where the base URL needs only %s: narrow it to %s", k, j, cc.AllowPrivate[j], size(p), a, host1))
			}
		}
	}
	return out
}

// size is the number of addresses in p, for people.
func size(p netip.Prefix) string {
	return new(big.Int).Lsh(big.NewInt(1), uint(p.Addr().BitLen()-p.Bits())).String()
}

// askProblems reports ask rules nobody can approve. A held call is decided
// only by a person the decision names (holds.Manager.CanApprove): a user
// name or "group:G". Without approvers.oidc the people are
// approvers.users, and one can decide only if they can log in (a
// password_hash or a token_sha256). With OIDC, names and groups come from
// the provider and cannot be checked here. An ask rule that names no
// approver is an error when no Rego module could add one, else a warning.
func askProblems(cfg *config.Config) []error {
	var out []error
	oidc := cfg.Approvers.OIDC != nil
	for i, p := range cfg.Policies {
		if p.Action != "ask" {
			continue
		}
		k := fmt.Sprintf("policies[%d]", i)
		switch {
		case len(p.Approvers) == 0 && len(cfg.Rego) == 0:
			out = append(out, fmt.Errorf("%s.approvers: the ask rule names no approver, so nobody can approve its calls (503 approval_unavailable); name a user or group:G", k))
			continue
		case len(p.Approvers) == 0:
			out = append(out, warnf("%s.approvers: the ask rule names no approver; its calls can be approved only if a rego module's decision adds one", k))
			continue
		case oidc:
			continue
		case len(cfg.Approvers.Users) == 0:
			out = append(out, fmt.Errorf("%s: nobody can approve this ask rule: approvers.users is empty and approvers.oidc is not set (its calls are refused 503 approval_unavailable)", k))
			continue
		}
		var why []string
		can := false
		for _, a := range p.Approvers {
			ok, reason := approvable(cfg.Approvers.Users, a)
			can = can || ok
			if !ok {
				why = append(why, reason)
			}
		}
		if !can {
			out = append(out, fmt.Errorf("%s.approvers: nobody can approve this ask rule: %s", k, strings.Join(why, "; ")))
		}
	}
	return out
}

// approvable says whether some user in users can log in and decide as a
// ("alice" or "group:G"), or why not.
func approvable(users []config.User, a string) (bool, string) {
	g, isGroup := strings.CutPrefix(a, "group:")
	found := false
	for _, u := range users {
		if isGroup && slices.Contains(u.Groups, g) || !isGroup && u.Name == a {
			found = true
			if u.PasswordHash != "" || u.TokenSHA256 != "" {
				return true, ""
			}
		}
	}
	switch {
	case found && isGroup:
		return false, fmt.Sprintf("no member of %s has a password_hash or token_sha256 to log in with", a)
	case found:
		return false, fmt.Sprintf("%s has no password_hash or token_sha256 to log in with", a)
	case isGroup:
		return false, fmt.Sprintf("%s has no member in approvers.users", a)
	}
	return false, fmt.Sprintf("%s is not in approvers.users", a)
}
