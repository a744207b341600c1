package connectors

import (
	"maps"
	"testing"
)

// TestMatch maps requests, as Envoy reports their method and target, to
// tools of real vendor specs.
func TestMatch(t *testing.T) {
	openai := mustLoad(t, "openai", "testdata/openai-3.1.yaml") // base https://api.openai.com/v1
	pets := mustLoad(t, "pets", "testdata/petstore-expanded-3.0.yaml")
	tw := loadTwilio(t)
	for _, tc := range []struct {
		name         string
		c            *Connector
		method, path string
		query        string
		tool         string // "" = no match
		params       map[string]string
	}{
		{"literal", openai, "POST", "/v1/responses", "", "openai.create_response", map[string]string{}},
		{"template", openai, "GET", "/v1/responses/resp_1", "", "openai.get_response", map[string]string{"response_id": "resp_1"}},
		// OpenAPI 3.1 §4.8.8: concrete paths are matched before templated ones.
		{"literal beats template", openai, "POST", "/v1/responses/input_tokens", "", "openai.getinputtokencounts", map[string]string{}},
		{"fixed query picks the beta operation", openai, "POST", "/v1/responses", "beta=true", "openai.beta_create_response", map[string]string{}},
		{"percent-encoded value decoded", openai, "GET", "/v1/responses/a%20b", "", "openai.get_response", map[string]string{"response_id": "a b"}},
		{"outside the base path", openai, "POST", "/responses", "", "", nil},
		{"base path prefix is not a segment", openai, "POST", "/v1x/responses", "", "", nil},
		{"parameter never spans a slash", openai, "GET", "/v1/responses/a/b", "", "", nil},
		{"method matters", openai, "PUT", "/v1/responses/input_tokens", "", "", nil},
		{"base path from servers", pets, "GET", "/v2/pets/7", "", "pets.find_pet_by_id", map[string]string{"id": "7"}},
		{"param inside a segment", tw, "GET", "/2010-04-01/Accounts/AC1/Messages/SM2.json", "", "twilio.fetch_message", map[string]string{"AccountSid": "AC1", "Sid": "SM2"}},
		{"suffix must match", tw, "GET", "/2010-04-01/Accounts/AC1/Messages/SM2.xml", "", "", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tool, params, ok := tc.c.Match(tc.method, tc.path, tc.query)
			if tc.tool == "" {
				if ok {
					t.Fatalf("Match(%s %s) = %s, want no match", tc.method, tc.path, tool.Name)
				}
				return
			}
			if !ok {
				t.Fatalf("Match(%s %s): no match, want %s", tc.method, tc.path, tc.tool)
			}
			if tool.Name != tc.tool || !maps.Equal(params, tc.params) {
				t.Fatalf("Match(%s %s) = %s %v, want %s %v", tc.method, tc.path, tool.Name, params, tc.tool, tc.params)
			}
		})
	}
}
