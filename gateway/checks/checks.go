// Package checks holds what `sluice validate` reports about a
// configuration beyond its syntax (config.Validate) that needs no running
// gateway: a connector's base URL the guard would refuse at every call, an
// allow_private wider than it needs, and ask rules nobody can approve.
// Warnings are problems validate prints without failing.
package checks

import (
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"net/url"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/guard"
)

// Findings are the problems the root's Check found in a configuration: Errors make
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

// Add files each problem as an error, or as a warning when it is a *Warning.
func (f *Findings) Add(ps []error) {
	for _, p := range ps {
		var w *Warning
		if errors.As(p, &w) {
			f.Warnings = append(f.Warnings, p)
		} else {
			f.Errors = append(f.Errors, p)
		}
	}
}

// Warning is a problem `sluice validate` prints without failing: the
// configuration works, but not as intended or not as narrowly as it could.
type Warning struct{ msg string }

func (w *Warning) Error() string { return w.msg }

// Warnf is a Warning.
func Warnf(format string, args ...any) error { return &Warning{fmt.Sprintf(format, args...)} }

// Upstreams checks each loaded connector's destination (dest: its base
// URL and allow_private as loaded; a nil URL is skipped) against its
// allow_private, as the guard will at every call: a base_url at an address
// the guard refuses (loopback, private, link-local … with no allow_private
// entry covering it; metadata, multicast or unspecified whatever
// allow_private says) is an error, since every call to it will be refused;
// an allow_private entry wider than the base URL needs, or that it does not
// need at all, is a warning naming the narrower prefix. Only an address
// literal (or localhost) can be judged here: a name is resolved and checked
// per call. serve logs these and runs: the guard refuses such calls with
// 403 egress_denied, by design.
func Upstreams(cfg *config.Config, dest func(slug string) (base *url.URL, allow []netip.Prefix)) []error {
	var out []error
	for i, cc := range cfg.Connectors {
		base, allow := dest(cc.Slug)
		if base == nil {
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
		host := base.Hostname()
		a, err := netip.ParseAddr(host)
		if err != nil {
			if guard.NameClass(host) == guard.Public {
				continue // a name: classified per call, after resolution
			}
			if c := guard.NameClass(host); !c.Allowable() {
				out = append(out, fmt.Errorf("%s: %s is a %s name: the guard refuses every call to it, whatever allow_private says", where, host, c))
			} else if len(allow) == 0 {
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
				out = append(out, Warnf("%s.allow_private[%d]: %s is not needed: the base URL's address %s is public (remove the entry)", k, j, p, a))
			}
			continue
		case !c.Allowable():
			out = append(out, fmt.Errorf("%s: %s is a %s address: the guard refuses every call to it, whatever allow_private says", where, a, c))
			continue
		case !guard.Admitted(c, a, allow):
			out = append(out, fmt.Errorf("%s: %s is a %s address and no connectors[%d].allow_private entry covers it: the guard refuses every call; add %s to allow_private if this API is meant to be internal", where, a, c, i, host1))
		}
		for j, p := range allow {
			switch {
			case !p.Contains(a):
				out = append(out, Warnf("%s.allow_private[%d]: %s does not cover the base URL's address %s: it admits nothing this connector dials (remove it, or use %s)", k, j, cc.AllowPrivate[j], a, host1))
			case p.Bits() < a.BitLen():
				out = append(out, Warnf("%s.allow_private[%d]: %s admits %s addresses where the base URL needs only %s: narrow it to %s", k, j, cc.AllowPrivate[j], size(p), a, host1))
			}
		}
	}
	return out
}

// size is the number of addresses in p, for people.
func size(p netip.Prefix) string {
	return new(big.Int).Lsh(big.NewInt(1), uint(p.Addr().BitLen()-p.Bits())).String()
}

// Asks reports ask rules nobody can approve. A held call is decided
// only by a person the decision names (holds.Manager.CanApprove): a user
// name or "group:G". Without approvers.oidc the people are
// approvers.users, and one can decide only if they can log in (a
// password_hash or a token_sha256). With OIDC, names and groups come from
// the provider and cannot be checked here. An ask rule that names no
// approver is an error when no Rego module could add one, else a warning.
func Asks(cfg *config.Config) []error {
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
			out = append(out, Warnf("%s.approvers: the ask rule names no approver; its calls can be approved only if a rego module's decision adds one", k))
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
