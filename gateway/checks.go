package gateway

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/catalog"
	"github.com/sluice-gw/sluice/gateway/checks"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/egress"
	"github.com/sluice-gw/sluice/gateway/guard"
	"github.com/sluice-gw/sluice/gateway/hosted"
	"github.com/sluice-gw/sluice/gateway/ingress"
	"github.com/sluice-gw/sluice/gateway/policylife"
	"github.com/sluice-gw/sluice/policy"
)

// CheckOptions say how Check loads: Strict makes every connector's spec
// load all-or-nothing (validate --strict), Defects also reports defects
// outside the operations (what validate shows; serve does not pay for it).
type CheckOptions struct {
	Logger  *slog.Logger
	Strict  bool
	Defects bool
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

// Findings are the problems Check found in a configuration (package
// checks).
type Findings = checks.Findings

// Check loads every spec (once), decides how each credential is attached,
// compiles the Rego and checks the modules (policy.Check), checks every
// secret reference, and checks what would fail at runtime
// (checks.Upstreams, checks.Asks); it returns every problem found, each
// naming its config key or file:line. It writes nothing and listens on
// nothing.
func Check(ctx context.Context, cfg *config.Config, opts CheckOptions) Findings {
	var f Findings
	cat, warns, err := catalog.Load(ctx, cfg, guard.New(guard.Options{}), catalog.Options{Strict: opts.Strict, Defects: opts.Defects})
	if err != nil {
		f.Errors = append(f.Errors, err)
	}
	f.Warnings = append(f.Warnings, warns...)
	listed, rwarns := cat.CheckRemotes(ctx, cfg) // remote MCP servers' tools
	f.Warnings = append(f.Warnings, rwarns...)
	for _, cc := range cfg.Connectors {
		if conn := listed[cc.Slug]; conn != nil {
			f.Connectors = append(f.Connectors, conn)
		} else if up := cat.Upstream(cc.Slug); up != nil {
			f.Connectors = append(f.Connectors, up.Conn)
		}
	}
	for i, p := range cfg.Policies {
		if slug, _, _ := strings.Cut(p.Match, "."); cat.IsRemote(slug) {
			if conn := listed[slug]; conn != nil && !strings.ContainsAny(p.Match, "*?") && !slices.ContainsFunc(conn.Tools, func(t *connectors.Tool) bool { return t.Name == p.Match }) {
				f.Warnings = append(f.Warnings, checks.Warnf("policies[%d].match: the remote MCP server %s lists no tool named %q now", i, slug, p.Match))
			}
			continue // a remote's tools are known only once it is listed
		}
		if !strings.ContainsAny(p.Match, "*?") {
			if _, ok := cat.Static(p.Match); !ok && err == nil {
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
	f.Errors = append(f.Errors, hosted.Problems(cfg)...)
	f.Errors = append(f.Errors, egress.Validate(cfg)...)
	f.Add(checks.Upstreams(cfg, func(slug string) (*url.URL, []netip.Prefix) {
		if up := cat.Upstream(slug); up != nil {
			return up.Conn.BaseURL, up.Allow
		}
		return nil, nil
	}))
	f.Add(checks.Asks(cfg))
	return f
}
