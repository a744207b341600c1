package wire

import "testing"

func TestPlaceholderEnvName(t *testing.T) {
	for _, tc := range []struct{ secret, want string }{
		{"gh-token", "SLUICE_SECRET_GH_TOKEN"},
		{"stripe.key", "SLUICE_SECRET_STRIPE_KEY"},
		{"A_b9", "SLUICE_SECRET_A_B9"},
		{"ключ", "SLUICE_SECRET_________"}, // 8 bytes of UTF-8, each replaced
	} {
		if got := PlaceholderEnvName(tc.secret); got != tc.want {
			t.Errorf("PlaceholderEnvName(%q) = %q, want %q", tc.secret, got, tc.want)
		}
	}
}
