// Package findings scans what a call would send for credentials: known
// formats (cloud keys, private keys, tokens, JWTs) and high-entropy
// strings. The policy engine puts what it finds in input.findings before
// every decision, so a rule can block or ask when an agent tries to send a
// secret to a host it is otherwise allowed to reach.
//
// A finding says what kind of secret was seen and where (a JSON pointer
// into the input document), and carries a short fingerprint of the match,
// never the match itself: the input document is logged and exported.
//
// Scanning is bounded: past MaxBytes of text or MaxFindings findings, the
// rest is not scanned, and a finding of kind Unscanned says where the
// scan stopped and why, so that a policy can refuse what it could not see.
//
// The package imports only the standard library.
package findings

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"math"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// Kinds of finding.
const (
	AWSAccessKeyID   = "aws_access_key_id"
	AWSSecretKey     = "aws_secret_access_key"
	GCPAPIKey        = "gcp_api_key"
	GCPServiceAcct   = "gcp_service_account_key"
	AzureStorageKey  = "azure_storage_key"
	PrivateKey       = "private_key"
	GitHubToken      = "github_token"
	SlackToken       = "slack_token"
	SlackWebhook     = "slack_webhook"
	StripeKey        = "stripe_key"
	JWT              = "jwt"
	HighEntropy      = "high_entropy"
	Unscanned        = "unscanned" // the scan stopped here (Reason says why)
	MaxBytes         = 1 << 20     // text scanned per input
	MaxFindings      = 64
	minEntropyLen    = 24  // shortest run of token characters judged by entropy
	minEntropy       = 4.0 // bits per character, for mixed-case alphanumeric runs
	minHexEntropyLen = 40  // hex runs: a SHA-1 or longer
	minHexEntropy    = 3.5
	minScanLen       = 16 // no known format is shorter
)

// Finding is one suspected secret.
type Finding struct {
	Kind string `json:"kind"`
	// Location is a JSON pointer into the input document
	// (/args/body/note, /request/headers/Authorization).
	Location string `json:"location"`
	// Fingerprint is "sha256:" and the first 12 hex digits of the SHA-256
	// of the match: enough to tell two findings apart or match a known
	// leaked key, never enough to recover it.
	Fingerprint string `json:"fingerprint,omitempty"`
	// Reason says why a place was not scanned (kind unscanned only).
	Reason string `json:"reason,omitempty"`
}

// pattern is one known credential format.
type pattern struct {
	kind string
	re   *regexp.Regexp
}

// patterns are the known formats, each anchored on its fixed prefix so
// that a miss is cheap. Sources: the vendors' published token formats
// (AWS IAM key IDs, GitHub's 2021 token format, Slack, Stripe), RFC 7468
// (PEM) and RFC 7519 (JWT).
var patterns = []pattern{
	{AWSAccessKeyID, regexp.MustCompile(`\b(?:AKIA|ASIA|ABIA|ACCA)[0-9A-Z]{16}\b`)},
	{AWSSecretKey, regexp.MustCompile(`(?i)aws.{0,20}secret.{0,20}?[=:"'\s]+([A-Za-z0-9/+]{40})\b`)},
	{GCPAPIKey, regexp.MustCompile(`\bAIza[0-9A-Za-z_\-]{35}`)},
	{GCPServiceAcct, regexp.MustCompile(`"type"\s*:\s*"service_account"`)},
	{AzureStorageKey, regexp.MustCompile(`AccountKey=[A-Za-z0-9+/]{86}==`)},
	{PrivateKey, regexp.MustCompile(`-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY( BLOCK)?-----`)},
	{GitHubToken, regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9_]{82})\b`)},
	{SlackToken, regexp.MustCompile(`\bxox[abposr]-[A-Za-z0-9-]{10,}`)},
	{SlackWebhook, regexp.MustCompile(`https://hooks\.slack\.com/services/T[A-Z0-9]+/B[A-Z0-9]+/[A-Za-z0-9]+`)},
	{StripeKey, regexp.MustCompile(`\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{24,}\b`)},
	{JWT, regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{16,}`)},
}

// prefilter holds a substring every pattern's match contains: a string
// with none of them skips the regexps.
var prefilter = []string{"AKIA", "ASIA", "ABIA", "ACCA", "ws", "WS", "AIza", "service_account", "AccountKey=", "PRIVATE KEY",
	"gh", "github_pat_", "xox", "hooks.slack.com", "_live_", "_test_", "eyJ"}

// Scanner accumulates findings over one input, within the bounds.
type Scanner struct {
	out     []Finding
	scanned int
	stopped bool
}

// Findings returns what was found, ordered by location (then kind), the
// unscanned marker last.
func (s *Scanner) Findings() []Finding {
	if s.out == nil {
		return []Finding{}
	}
	sort.SliceStable(s.out, func(i, j int) bool {
		a, b := s.out[i], s.out[j]
		if (a.Kind == Unscanned) != (b.Kind == Unscanned) {
			return b.Kind == Unscanned
		}
		if a.Location != b.Location {
			return a.Location < b.Location
		}
		return a.Kind < b.Kind
	})
	return s.out
}

// Value scans every string in a JSON-shaped value (maps, slices, strings,
// numbers) at pointer ptr.
func (s *Scanner) Value(ptr string, v any) {
	switch x := v.(type) {
	case string:
		s.String(ptr, x)
	case map[string]any:
		// Keys in order: where the bounds stop the scan must not depend
		// on map order, or one input could be decided two ways.
		keys := make([]string, 0, len(x))
		for k, e := range x {
			if !short(e) { // saves sorting it and building its pointer
				keys = append(keys, k)
			}
		}
		sort.Strings(keys)
		for _, k := range keys {
			s.Value(ptr+"/"+Escape(k), x[k])
		}
	case []any:
		for i, e := range x {
			if short(e) {
				continue
			}
			s.Value(ptr+"/"+strconv.Itoa(i), e)
		}
	case map[string][]string:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			vs := x[k]
			for i, e := range vs {
				p := ptr + "/" + Escape(k)
				if len(vs) > 1 {
					p += "/" + strconv.Itoa(i)
				}
				s.String(p, e)
			}
		}
	}
}

// short says v holds nothing to scan: a number, a bool, or a string
// shorter than any format.
func short(v any) bool {
	switch x := v.(type) {
	case string:
		return len(x) < minScanLen
	case map[string]any, []any, map[string][]string:
		return false
	}
	return true
}

// Escape escapes a JSON pointer reference token (RFC 6901).
func Escape(k string) string {
	if !strings.ContainsAny(k, "~/") {
		return k
	}
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}

// String scans one string found at ptr.
func (s *Scanner) String(ptr, v string) {
	if s.stopped || len(v) < minScanLen {
		return
	}
	if s.scanned+len(v) > MaxBytes {
		s.stop(ptr, fmt.Sprintf("over the %d-byte scan bound: not scanned", MaxBytes))
		return
	}
	s.scanned += len(v)
	var known [][2]int // spans matched by a known format: not judged again by entropy
	if hasAny(v, prefilter) {
		for _, p := range patterns {
			for _, m := range p.re.FindAllStringSubmatchIndex(v, -1) {
				lo, hi := m[0], m[1]
				if len(m) >= 4 && m[2] >= 0 { // the secret is the first group
					lo, hi = m[2], m[3]
				}
				if !s.add(Finding{Kind: p.kind, Location: ptr, Fingerprint: fingerprint(v[lo:hi])}) {
					return
				}
				known = append(known, [2]int{m[0], m[1]})
			}
		}
	}
	s.entropy(ptr, v, known)
}

// entropy reports runs of token characters that look random.
func (s *Scanner) entropy(ptr, v string, known [][2]int) {
	start := -1
	for i := 0; i <= len(v); i++ {
		if i < len(v) && tokenChar(v[i]) {
			if start < 0 {
				start = i
			}
			continue
		}
		if start >= 0 && i-start >= minEntropyLen && !covered(known, start, i) {
			run := v[start:i]
			if random(run) && !s.add(Finding{Kind: HighEntropy, Location: ptr, Fingerprint: fingerprint(run)}) {
				return
			}
		}
		start = -1
	}
}

func covered(spans [][2]int, lo, hi int) bool {
	for _, sp := range spans {
		if lo < sp[1] && sp[0] < hi {
			return true
		}
	}
	return false
}

// tokenChar: the characters of base64, base64url and hex.
func tokenChar(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '/' || c == '_' || c == '-' || c == '='
}

// random judges a run: hex needs minHexEntropyLen characters and
// minHexEntropy bits each; anything else needs upper, lower and digits and
// minEntropy bits per character (ordinary words and identifiers stay
// below it, keys and tokens above).
func random(run string) bool {
	run = strings.TrimRight(run, "=")
	var upper, lower, digit, hexOnly = false, false, false, true
	for i := 0; i < len(run); i++ {
		c := run[i]
		switch {
		case c >= 'A' && c <= 'Z':
			upper = true
		case c >= 'a' && c <= 'z':
			lower = true
		case c >= '0' && c <= '9':
			digit = true
		}
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
			hexOnly = false
		}
	}
	if hexOnly {
		return len(run) >= minHexEntropyLen && Shannon(run) >= minHexEntropy
	}
	return len(run) >= minEntropyLen && upper && lower && digit && Shannon(run) >= minEntropy
}

// Shannon is the entropy of s's bytes, in bits per byte (0 for ""): the
// measure of a random-looking secret here and of an exfiltrating DNS label
// in gateway/egress.
func Shannon(s string) float64 {
	var counts [256]int
	for i := 0; i < len(s); i++ {
		counts[s[i]]++
	}
	n := float64(len(s))
	h := 0.0
	for _, c := range counts {
		if c > 0 {
			p := float64(c) / n
			h -= p * math.Log2(p)
		}
	}
	return h
}

func hasAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

// add appends f, unless the bound is reached: then it records the stop
// and reports false.
func (s *Scanner) add(f Finding) bool {
	if len(s.out) >= MaxFindings {
		s.stop(f.Location, fmt.Sprintf("more than %d findings: the rest not scanned", MaxFindings))
		return false
	}
	s.out = append(s.out, f)
	return true
}

func (s *Scanner) stop(ptr, reason string) {
	if !s.stopped {
		s.stopped = true
		s.out = append(s.out, Finding{Kind: Unscanned, Location: ptr, Reason: reason})
	}
}

func fingerprint(m string) string {
	h := sha256.Sum256([]byte(m))
	return "sha256:" + hex.EncodeToString(h[:6])
}
