package connectors

import (
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// matcher is a connector's tools compiled for Match: one anchored pattern
// per tool over the escaped path below the base URL's path.
type matcher struct {
	once   sync.Once
	routes []route
}

type route struct {
	tool    *Tool
	re      *regexp.Regexp
	names   []string // path parameters, in the order re captures them
	literal int      // literal bytes of the template: more is more specific
	fixed   url.Values
}

// Match finds the tool a request to this connector's host is: the
// operation whose method is method and whose path template, below the
// base URL's path, matches escapedPath (the request target's path, as
// sent). It returns the path parameters, percent-decoded. When several
// templates match, the most specific wins, as OpenAPI asks ("/pets/mine"
// before "/pets/{id}"): the most literal bytes, then a fixed query the
// request carries. Each parameter matches exactly one segment (or part of
// one), never a '/'. A request that matches no operation is not one of
// this connector's tools.
func (c *Connector) Match(method, escapedPath, rawQuery string) (*Tool, map[string]string, bool) {
	if c == nil {
		return nil, nil, false
	}
	c.match.once.Do(c.compileRoutes)
	base := ""
	if c.BaseURL != nil {
		base = strings.TrimRight(c.BaseURL.EscapedPath(), "/")
	}
	rest, ok := strings.CutPrefix(escapedPath, base)
	if !ok || (rest != "" && rest[0] != '/') {
		return nil, nil, false
	}
	if rest == "" {
		rest = "/"
	}
	var query url.Values
	var best *route
	var bestVals []string
	for i := range c.match.routes {
		r := &c.match.routes[i]
		if r.tool.Method != method {
			continue
		}
		m := r.re.FindStringSubmatch(rest)
		if m == nil {
			continue
		}
		if len(r.fixed) > 0 {
			if query == nil {
				query, _ = url.ParseQuery(rawQuery)
			}
			if !hasAll(query, r.fixed) {
				continue
			}
		}
		if best == nil || r.literal > best.literal || (r.literal == best.literal && len(r.fixed) > len(best.fixed)) {
			best, bestVals = r, m[1:]
		}
	}
	if best == nil {
		return nil, nil, false
	}
	params := make(map[string]string, len(best.names))
	for i, n := range best.names {
		v, err := url.PathUnescape(bestVals[i])
		if err != nil {
			return nil, nil, false
		}
		params[n] = v
	}
	return best.tool, params, true
}

func hasAll(q, want url.Values) bool {
	for k, vs := range want {
		for _, v := range vs {
			if !slices.Contains(q[k], v) {
				return false
			}
		}
	}
	return true
}

// compileRoutes builds one pattern per tool. A template that does not
// compile (it cannot: load checked it) leaves the tool unmatched.
func (c *Connector) compileRoutes() {
	for _, t := range c.Tools {
		var b strings.Builder
		b.WriteString("^")
		var names []string
		literal := 0
		rest := t.PathTemplate
		for {
			i := strings.IndexByte(rest, '{')
			if i < 0 {
				lit := escapeLiteral(rest)
				b.WriteString(regexp.QuoteMeta(lit))
				literal += len(lit)
				break
			}
			j := strings.IndexByte(rest[i:], '}')
			if j < 0 {
				names = nil
				break
			}
			lit := escapeLiteral(rest[:i])
			b.WriteString(regexp.QuoteMeta(lit))
			literal += len(lit)
			names = append(names, rest[i+1:i+j])
			b.WriteString("([^/]+?)")
			rest = rest[i+j+1:]
		}
		b.WriteString("$")
		re, err := regexp.Compile(b.String())
		if err != nil {
			continue
		}
		var fixed url.Values
		if t.fixedQuery != "" {
			fixed, _ = url.ParseQuery(t.fixedQuery)
		}
		c.match.routes = append(c.match.routes, route{tool: t, re: re, names: names, literal: literal, fixed: fixed})
	}
}
