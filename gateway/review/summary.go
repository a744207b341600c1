package review

import (
	"bytes"
	"encoding/json"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Limits of the one-line argument summary on a queue card.
const (
	summaryArgs  = 4  // arguments named at most
	summaryValue = 32 // runes of one value shown
	summaryLine  = 140
)

// secretish names arguments whose value a summary never shows, whatever
// it is: the summary is read at a glance, over a shoulder, in a
// notification. The full arguments stay on the hold page (they are what
// the agent sent, never a credential the gateway attaches).
var secretish = []string{"password", "passwd", "secret", "token", "apikey", "api_key", "api-key",
	"authorization", "cookie", "credential", "private_key", "privatekey", "session_key", "signature"}

func secretName(k string) bool {
	k = strings.ToLower(k)
	for _, s := range secretish {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// arg is one scalar argument a summary may name.
type arg struct {
	key  string
	val  string // as shown: numbers and booleans as written, strings quoted
	rank int    // lower first
}

// argSummary is the one-line summary of an arguments document
// ({"path":{…},"query":{…},"headers":{…},"body":…}) for a queue card:
// up to summaryArgs scalar arguments, picked the same way every time —
// path parameters first (they name the object acted on), then numbers
// (amounts, counts), short strings (IDs, tickets), booleans and longer
// strings, each group by name — each value cut at summaryValue runes and
// the line at summaryLine, with how many were left out. Header arguments
// and arguments named like credentials are never shown; a placeholder the
// agent sent stays the placeholder it sent. A document that is not JSON
// gives "".
func argSummary(doc []byte) string {
	dec := json.NewDecoder(bytes.NewReader(doc))
	dec.UseNumber()
	var v map[string]any
	if err := dec.Decode(&v); err != nil {
		return ""
	}
	var args []arg
	left := 0
	add := func(key string, x any, pathParam bool) {
		if secretName(key) {
			left++
			return
		}
		a := arg{key: key}
		switch y := x.(type) {
		case json.Number:
			a.val, a.rank = y.String(), 1
		case bool:
			a.val, a.rank = strconv.FormatBool(y), 3
		case string:
			a.val, a.rank = `"`+cutRunes(y, summaryValue)+`"`, 2
			if utf8.RuneCountInString(y) > summaryValue {
				a.rank = 4
			}
		case nil:
			a.val, a.rank = "null", 5
		default: // objects and arrays are not one-liners
			left++
			return
		}
		if pathParam {
			a.rank = 0
		}
		args = append(args, a)
	}
	scalars := func(m any, pathParam bool) {
		if o, ok := m.(map[string]any); ok {
			for k, x := range o {
				add(k, x, pathParam)
			}
		}
	}
	scalars(v["path"], true)
	scalars(v["query"], false)
	switch b := v["body"].(type) {
	case map[string]any:
		scalars(b, false)
	case nil:
	default:
		add("body", b, false)
	}
	if h, ok := v["headers"].(map[string]any); ok {
		left += len(h)
	}
	slices.SortFunc(args, func(a, b arg) int {
		if a.rank != b.rank {
			return a.rank - b.rank
		}
		return strings.Compare(a.key, b.key)
	})
	if len(args) > summaryArgs {
		left += len(args) - summaryArgs
		args = args[:summaryArgs]
	}
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = cutRunes(a.key, summaryValue) + "=" + a.val
	}
	line := cutRunes(strings.Join(parts, " · "), summaryLine)
	if left > 0 {
		if line != "" {
			line += " "
		}
		line += "+" + strconv.Itoa(left) + " more"
	}
	return line
}

// cutRunes cuts s to n runes, marking the cut with "…".
func cutRunes(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	i := 0
	for j := range s {
		if i == n-1 {
			return s[:j] + "…"
		}
		i++
	}
	return s
}
