package wire

import "strings"

// PlaceholderEnvName is the environment variable a secret's placeholder
// (GET /api/v1/placeholders on the gateway's admin listener) is put in
// inside a sandbox: SLUICE_SECRET_ and the secret's name in upper case,
// every byte other than A-Z, 0-9 and _ turned into _. sandboxd sets it in
// the sandboxes it makes; `sluice placeholders --env` prints it for
// sandboxes other runtimes made.
func PlaceholderEnvName(secret string) string {
	b := []byte(strings.ToUpper(secret))
	for i, c := range b {
		if !('A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	return "SLUICE_SECRET_" + string(b)
}
