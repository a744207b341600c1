package connectors

import (
	"os"
	"path/filepath"
	"testing"
)

// TestIdempotencyHeader: an operation is idempotency-keyed when it declares
// a header parameter named Idempotency-Key, in any case (Stripe publishes
// it so); the same name elsewhere, or no such parameter, is not.
func TestIdempotencyHeader(t *testing.T) {
	const head = "openapi: 3.0.3\ninfo: {title: t, version: '1'}\nservers: [{url: 'https://x.example'}]\npaths:\n  /charges:\n"
	cases := []struct {
		name string
		path string // the path item's body under /charges
		want string
	}{
		{"operation header", `    post:
      operationId: create
      parameters: [{name: Idempotency-Key, in: header, schema: {type: string}}]
      responses: {"200": {description: ok}}
`, "Idempotency-Key"},
		{"lower case, as spelled", `    post:
      operationId: create
      parameters: [{name: idempotency-key, in: header, schema: {type: string}}]
      responses: {"200": {description: ok}}
`, "idempotency-key"},
		{"path-item header applies to the operation", `    parameters: [{name: IDEMPOTENCY-KEY, in: header, schema: {type: string}}]
    post:
      operationId: create
      responses: {"200": {description: ok}}
`, "IDEMPOTENCY-KEY"},
		{"query parameter of that name is not a key", `    post:
      operationId: create
      parameters: [{name: Idempotency-Key, in: query, schema: {type: string}}]
      responses: {"200": {description: ok}}
`, ""},
		{"other header", `    post:
      operationId: create
      parameters: [{name: X-Idempotency-Token, in: header, schema: {type: string}}]
      responses: {"200": {description: ok}}
`, ""},
		{"no parameters", `    post:
      operationId: create
      responses: {"200": {description: ok}}
`, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "spec.yaml")
			if err := os.WriteFile(p, []byte(head+tc.path), 0o644); err != nil {
				t.Fatal(err)
			}
			tl := tool(t, mustLoad(t, "x", p), "x.create")
			if tl.IdempotencyHeader != tc.want {
				t.Errorf("IdempotencyHeader = %q, want %q", tl.IdempotencyHeader, tc.want)
			}
		})
	}
}
