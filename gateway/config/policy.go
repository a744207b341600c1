package config

import (
	"fmt"
	"math"
	"net/url"
)

// Agent is a kind of agent and what it is granted.
type Agent struct {
	Name       string   `yaml:"name"`
	Connectors []string `yaml:"connectors"`
	Egress     []string `yaml:"egress"`
	// RateLimit caps each of this agent's sandboxes' tool calls; nil is
	// no cap (the pending-approval cap still applies).
	RateLimit *RateLimit `yaml:"rate_limit"`
}

// RateLimit is a token bucket: PerSecond calls on average, Burst at once
// (default: PerSecond rounded up).
type RateLimit struct {
	PerSecond float64 `yaml:"per_second"`
	Burst     int     `yaml:"burst"`
}

// Policy is one simple rule.
type Policy struct {
	Match     string   `yaml:"match"`
	Action    string   `yaml:"action"`
	Approvers []string `yaml:"approvers"`
	Reason    string   `yaml:"reason"`
	// HoldTTL overrides gateway.hold_ttl for calls this (ask) rule holds.
	HoldTTL Duration `yaml:"hold_ttl"`
}

// Approvers configures who may approve held calls (the holds issue).
type Approvers struct {
	Users []User `yaml:"users"`
	OIDC  *OIDC  `yaml:"oidc"`
}

// User is an embedded approver account.
type User struct {
	Name         string   `yaml:"name"`
	Groups       []string `yaml:"groups"`
	PasswordHash string   `yaml:"password_hash"`
	// TokenSHA256 is the hex SHA-256 of this person's admin API token
	// (`sluice approvals`, Authorization: Bearer TOKEN); empty: no token.
	TokenSHA256 string `yaml:"token_sha256"`
}

// Approvals configures notifications about held calls.
type Approvals struct {
	// WebhookURL receives a Slack-compatible {"text": …} POST for every new hold.
	WebhookURL string `yaml:"webhook_url"`
	// PublicURL is the review UI's address as approvers reach it, for the
	// links in notifications (default: http://ADMIN_LISTEN).
	PublicURL string `yaml:"public_url"`
}

// OIDC is approver login through an OpenID provider.
type OIDC struct {
	Issuer           string `yaml:"issuer"`
	ClientID         string `yaml:"client_id"`
	ClientSecretFile string `yaml:"client_secret_file"`
	GroupsClaim      string `yaml:"groups_claim"`
}

// validateAgents checks agents[]: names, the connectors they name (of
// slugs), egress entries and rate limits (an unset burst becomes
// per_second rounded up).
func validateAgents(agents []Agent, slugs map[string]bool, bad func(key, format string, args ...any)) {
	names := map[string]bool{}
	for i, a := range agents {
		k := fmt.Sprintf("agents[%d]", i)
		if !nameRE.MatchString(a.Name) {
			bad(k+".name", "not a name: %q", a.Name)
		} else if names[a.Name] {
			bad(k+".name", "%q is used twice", a.Name)
		}
		names[a.Name] = true
		for j, s := range a.Connectors {
			if !slugs[s] {
				bad(fmt.Sprintf("%s.connectors[%d]", k, j), "no connector has slug %q", s)
			}
		}
		for j, h := range a.Egress {
			if !ValidEgress(h) {
				bad(fmt.Sprintf("%s.egress[%d]", k, j), "want a lower-case host name or *.domain, got %q", h)
			}
		}
		if rl := a.RateLimit; rl != nil {
			switch {
			case !(rl.PerSecond > 0) || rl.PerSecond > 1e6:
				bad(k+".rate_limit.per_second", "want a number of calls per second above 0 and at most 1000000, got %v", rl.PerSecond)
			case rl.Burst < 0 || rl.Burst > 1e6:
				bad(k+".rate_limit.burst", "want 0 (per_second rounded up) to 1000000 calls, got %d", rl.Burst)
			case rl.Burst == 0:
				rl.Burst = int(math.Ceil(rl.PerSecond))
			}
		}
	}
}

// validatePolicies checks policies[], rego[], approvers.* and approvals.*.
func validatePolicies(c *Config, bad func(key, format string, args ...any)) {
	for i, p := range c.Policies {
		k := fmt.Sprintf("policies[%d]", i)
		if !matchRE.MatchString(p.Match) {
			bad(k+".match", "want a tool name or glob like billing-api.get_*, got %q", p.Match)
		}
		switch p.Action {
		case "allow", "block":
			if len(p.Approvers) > 0 {
				bad(k+".approvers", "only ask rules have approvers")
			}
		case "ask":
		default:
			bad(k+".action", "want allow, ask or block, got %q", p.Action)
		}
	}
	for i, p := range c.Policies {
		if p.HoldTTL < 0 || (p.HoldTTL != 0 && p.Action != "ask") {
			bad(fmt.Sprintf("policies[%d].hold_ttl", i), "only ask rules have a hold_ttl, and it must be positive")
		}
	}
	for i, r := range c.Rego {
		if r == "" {
			bad(fmt.Sprintf("rego[%d]", i), "empty path")
		}
	}
	for i, u := range c.Approvers.Users {
		if !nameRE.MatchString(u.Name) {
			bad(fmt.Sprintf("approvers.users[%d].name", i), "not a name: %q", u.Name)
		}
		if u.TokenSHA256 != "" && !sha256RE.MatchString(u.TokenSHA256) {
			bad(fmt.Sprintf("approvers.users[%d].token_sha256", i), "want 64 lowercase hex digits (sha256sum of the token)")
		}
	}
	if c.Approvers.OIDC != nil && c.Approvals.PublicURL == "" {
		bad("approvals.public_url", "must be set with approvers.oidc: the OIDC redirect URL is built from it")
	}
	for _, kv := range [][2]string{{"approvals.webhook_url", c.Approvals.WebhookURL}, {"approvals.public_url", c.Approvals.PublicURL}} {
		k, v := kv[0], kv[1]
		if v == "" {
			continue
		}
		if u, err := url.Parse(v); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			bad(k, "want an http(s) URL")
		}
	}
}
