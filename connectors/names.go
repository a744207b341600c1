package connectors

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
)

// slugRE is the shape of a connector slug: it becomes the prefix of every
// tool name and appears in policy rules, so it is kept to a small alphabet.
var slugRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

func checkSlug(slug string) error {
	if !slugRE.MatchString(slug) {
		return fmt.Errorf("slug %q: must match %s", slug, slugRE)
	}
	return nil
}

// snakeCase turns an operationId (or any identifier) into lower snake case:
// listTickets → list_tickets, whoAmI → who_am_i, getHTTPResponse →
// get_http_response, list-pets → list_pets. Anything that is not an ASCII
// letter or digit separates words; runs of separators collapse.
func snakeCase(s string) string {
	var b strings.Builder
	b.Grow(len(s) + 8)
	sep := false // a separator is pending
	isUpper := func(c byte) bool { return c >= 'A' && c <= 'Z' }
	isLower := func(c byte) bool { return c >= 'a' && c <= 'z' }
	isDigit := func(c byte) bool { return c >= '0' && c <= '9' }
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case isUpper(c):
			if i > 0 {
				prev := s[i-1]
				nextLower := i+1 < len(s) && isLower(s[i+1])
				if isLower(prev) || isDigit(prev) || (isUpper(prev) && nextLower) {
					sep = true
				}
			}
			c += 'a' - 'A'
		case isLower(c), isDigit(c):
		default:
			sep = true
			continue
		}
		if sep && b.Len() > 0 {
			b.WriteByte('_')
		}
		sep = false
		b.WriteByte(c)
	}
	return b.String()
}

// derivedOperationID names an operation that has no operationId from its
// method and path: GET /pets/{petId} → get_pets_pet_id.
func derivedOperationID(method, path string) string {
	return snakeCase(strings.ToLower(method) + "_" + path)
}

// maxAlias is the longest function name OpenAI and Anthropic accept.
const maxAlias = 64

// aliasFor derives a tool's function-safe alias from its name: the dot
// becomes "_" (a slug has no "_", so the first "_" is the boundary and
// two names never share an alias), and a name too long is cut and given
// the first 8 hex digits of its SHA-256, so the alias is stable.
func aliasFor(name string) string {
	a := strings.Replace(name, ".", "_", 1)
	if len(a) <= maxAlias {
		return a
	}
	sum := sha256.Sum256([]byte(name))
	return a[:maxAlias-9] + "_" + hex.EncodeToString(sum[:4])
}

// aliasRE is the shape of a function name OpenAI and Anthropic accept.
var aliasRE = regexp.MustCompile(`^[a-zA-Z0-9_-]{1,64}$`)

// ToolName is the name an operation with operationID gets in connector
// slug: "<slug>.<operationID in snake_case>", or "" when operationID has
// no ASCII letter or digit. A connector built from a generated document
// (a remote MCP server's tools) names its tools ahead with it.
func ToolName(slug, operationID string) string {
	s := snakeCase(operationID)
	if s == "" {
		return ""
	}
	return slug + "." + s
}
