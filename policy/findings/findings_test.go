package findings

import (
	"strings"
	"testing"
)

// Test values are made for these tests (random, or the vendors' documented
// example shapes); none is a real credential.
var cases = []struct {
	name, value, kind string
}{
	{"AWS access key ID (IAM key ID format)", "key AKIAQWERTYUIOPASDF12 here", AWSAccessKeyID},
	{"AWS secret access key beside its name", `aws_secret_access_key = "wJalrXUtnFEMIK7MDENGbPxRfiCYzEXAMPLEKEYq"`, AWSSecretKey},
	{"GCP API key", "key=AIzaSyD4x9Qw3Er5Ty7Ui9Op1As3Df5Gh7Jk9Lz", GCPAPIKey},
	{"GCP service account JSON", `{"type": "service_account", "project_id": "p"}`, GCPServiceAcct},
	{"Azure storage connection string", "AccountName=x;AccountKey=" + strings.Repeat("Ab3+", 21) + "Ab==", AzureStorageKey},
	{"PEM private key (RFC 7468)", "-----BEGIN RSA PRIVATE KEY-----\nMIIE...", PrivateKey},
	{"OpenSSH private key", "-----BEGIN OPENSSH PRIVATE KEY-----", PrivateKey},
	{"GitHub personal access token", "token ghp_" + strings.Repeat("aB3", 12), GitHubToken},
	{"GitHub fine-grained token", "github_pat_" + strings.Repeat("aB3_x", 16) + "aB", GitHubToken},
	{"Slack bot token", "xoxb-1234567890-abcdefghij", SlackToken},
	{"Slack webhook", "https://hooks.slack.com/services/T0ABC/B0DEF/abcdEFGH1234", SlackWebhook},
	{"Stripe secret key", "sk_live_" + strings.Repeat("4eC39HqLyjWDarjtT1zdp7dc", 1), StripeKey},
	{"JWT (RFC 7519)", "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", JWT},
	{"high-entropy base64", "secret: q8Zr2XbT7vNw4KpY1mLs9DfG3hJc6QaE", HighEntropy},
	{"high-entropy hex (40+)", "sig " + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", HighEntropy},
}

func TestKnownFormats(t *testing.T) {
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var s Scanner
			s.Value("/args", map[string]any{"body": map[string]any{"note": tc.value}})
			fs := s.Findings()
			found := false
			for _, f := range fs {
				if f.Kind == tc.kind {
					found = true
					if f.Location != "/args/body/note" || !strings.HasPrefix(f.Fingerprint, "sha256:") || len(f.Fingerprint) != len("sha256:")+12 {
						t.Fatalf("finding %+v: want location /args/body/note and a 12-digit fingerprint", f)
					}
				}
				if strings.Contains(f.Fingerprint+f.Location+f.Reason, tc.value) {
					t.Fatalf("the finding carries the value: %+v", f)
				}
			}
			if !found {
				t.Fatalf("findings %+v, want a %s", fs, tc.kind)
			}
		})
	}
}

// TestOrdinaryValuesPass: what agents send all day is not a finding.
func TestOrdinaryValuesPass(t *testing.T) {
	for _, v := range []string{
		"Please refund the duplicate charge from last Tuesday, thanks!",
		"550e8400-e29b-41d4-a716-446655440000",           // a UUID
		"/v1/customers/cus_123/invoices?limit=10&page=2", // a path
		"d41d8cd98f00b204e9800998ecf8427e",               // 32 hex digits (MD5): a checksum, under the hex bound
		"ThisIsALongIdentifierNameForAFunction",          // mixed case, no digits
		"application/vnd.github.v3+json",
		"2026-12-02T05:10:10.123456789Z",
	} {
		var s Scanner
		s.String("/args/x", v)
		if fs := s.Findings(); len(fs) != 0 {
			t.Errorf("%q: findings %+v, want none", v, fs)
		}
	}
}

func TestLocations(t *testing.T) {
	var s Scanner
	s.Value("/request/headers", map[string][]string{"Authorization": {"token ghp_" + strings.Repeat("aB3", 12)}, "X-A/B": {"ok", "xoxb-1234567890-abcdefghij"}})
	got := map[string]string{}
	for _, f := range s.Findings() {
		got[f.Location] = f.Kind
	}
	if got["/request/headers/Authorization"] != GitHubToken || got["/request/headers/X-A~1B/1"] != SlackToken {
		t.Fatalf("locations = %v", got)
	}
}

// TestBounds: past the bounds the rest is not scanned, and one unscanned
// finding says where and why (a policy can refuse what was not seen).
func TestBounds(t *testing.T) {
	var s Scanner
	s.String("/args/a", strings.Repeat("a", MaxBytes-10))
	s.String("/args/b", "AKIAQWERTYUIOPASDF12 and more text")
	fs := s.Findings()
	if len(fs) != 1 || fs[0].Kind != Unscanned || fs[0].Location != "/args/b" || !strings.Contains(fs[0].Reason, "scan bound") {
		t.Fatalf("findings = %+v, want one unscanned at /args/b", fs)
	}
	var many Scanner
	for i := range MaxFindings + 5 {
		many.String("/args/"+string(rune('a'+i%26)), "AKIAQWERTYUIOPASDF12")
	}
	fs = many.Findings()
	if len(fs) != MaxFindings+1 || fs[MaxFindings].Kind != Unscanned {
		t.Fatalf("%d findings, last %+v; want %d and an unscanned", len(fs), fs[len(fs)-1], MaxFindings+1)
	}
}

// BenchmarkTypicalArguments is the scanner on a tool call's arguments as
// agents send them (test/bench reports it beside the decision).
func BenchmarkTypicalArguments(b *testing.B) {
	args := map[string]any{
		"path":  map[string]any{"id": "cus_8f2a91"},
		"query": map[string]any{"expand": []any{"lines", "customer"}},
		"body": map[string]any{
			"amount": 1250, "currency": "usd", "reason": "Customer was charged twice for the March invoice; refund the duplicate.",
			"metadata": map[string]any{"ticket": "SUP-10432", "requested_by": "support-bot", "idempotency": "550e8400-e29b-41d4-a716-446655440000"},
		},
	}
	b.ReportAllocs()
	for b.Loop() {
		var s Scanner
		s.Value("/args", args)
		if len(s.Findings()) != 0 {
			b.Fatal("finding in clean arguments")
		}
	}
}
