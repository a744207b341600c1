package mcpremote

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// maxInlined bounds the schema nodes resolving $ref may make: a schema
// whose definitions refer to each other twice at each level would grow
// exponentially (the "billion laughs" shape).
const maxInlined = 20000

// resolveRefs replaces each $ref of a remote schema that points inside
// the schema itself ("#", "#/$defs/name", any JSON pointer into it) with
// what it points at, so that the schema means the same without its
// definitions (the gateway's tool document is not the remote's: a
// reference left in it would resolve against the wrong document). The
// definitions ($defs, definitions) are then dropped from the root.
//
// A reference elsewhere (another document, an $id, an anchor), a cycle,
// a $dynamicRef, or an expansion past maxInlined nodes is refused with
// the reason, and the tool is left out.
func resolveRefs(root map[string]any) (map[string]any, error) {
	r := &resolver{root: root}
	out, err := r.node(root, nil)
	if err != nil {
		return nil, err
	}
	m, ok := out.(map[string]any)
	if !ok {
		return nil, errors.New("bug: a resolved schema is not an object")
	}
	delete(m, "$defs")
	delete(m, "definitions")
	return m, nil
}

type resolver struct {
	root  map[string]any
	nodes int
}

// node returns v with its references resolved; stack holds the
// references being expanded (a cycle is one met again).
func (r *resolver) node(v any, stack []string) (any, error) {
	r.nodes++
	if r.nodes > maxInlined {
		return nil, fmt.Errorf("resolving $ref makes more than %d schema nodes", maxInlined)
	}
	switch x := v.(type) {
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			n, err := r.node(e, stack)
			if err != nil {
				return nil, err
			}
			out[i] = n
		}
		return out, nil
	case map[string]any:
		if _, ok := x["$dynamicRef"]; ok {
			return nil, errors.New("$dynamicRef is not supported")
		}
		if _, ok := x["$recursiveRef"]; ok {
			return nil, errors.New("$recursiveRef is not supported")
		}
		out := make(map[string]any, len(x))
		for k, e := range x {
			if k == "$ref" {
				continue
			}
			if k == "$defs" || k == "definitions" {
				// Resolved where they are used; kept only until the root drops them.
				out[k] = e
				continue
			}
			n, err := r.node(e, stack)
			if err != nil {
				return nil, err
			}
			out[k] = n
		}
		ref, has := x["$ref"]
		if !has {
			return out, nil
		}
		s, ok := ref.(string)
		if !ok {
			return nil, errors.New("a $ref that is not a string")
		}
		target, err := r.lookup(s)
		if err != nil {
			return nil, err
		}
		for _, seen := range stack {
			if seen == s {
				return nil, fmt.Errorf("$ref %q is cyclic (%s)", s, strings.Join(append(stack, s), " → "))
			}
		}
		resolved, err := r.node(target, append(stack[:len(stack):len(stack)], s))
		if err != nil {
			return nil, err
		}
		if rm, ok := resolved.(map[string]any); ok {
			delete(rm, "$defs")
			delete(rm, "definitions")
		}
		if len(out) == 0 {
			return resolved, nil
		}
		// 2020-12: $ref applies beside its siblings; allOf says the same.
		all, _ := out["allOf"].([]any)
		out["allOf"] = append(all[:len(all):len(all)], resolved)
		return out, nil
	}
	return v, nil
}

// lookup follows a same-document reference: "#" and a JSON pointer
// (RFC 6901) after it.
func (r *resolver) lookup(ref string) (any, error) {
	if !strings.HasPrefix(ref, "#") {
		return nil, fmt.Errorf("$ref %q refers outside the schema (only #/… references inside it are resolved)", clip(ref))
	}
	ptr := ref[1:]
	if ptr == "" {
		return r.root, nil
	}
	if !strings.HasPrefix(ptr, "/") {
		return nil, fmt.Errorf("$ref %q names an anchor; only JSON pointers (#/…) are resolved", clip(ref))
	}
	var cur any = r.root
	for _, tok := range strings.Split(ptr[1:], "/") {
		tok = strings.ReplaceAll(strings.ReplaceAll(tok, "~1", "/"), "~0", "~")
		switch c := cur.(type) {
		case map[string]any:
			next, ok := c[tok]
			if !ok {
				return nil, fmt.Errorf("$ref %q points at nothing", clip(ref))
			}
			cur = next
		case []any:
			i, err := strconv.Atoi(tok)
			if err != nil || i < 0 || i >= len(c) {
				return nil, fmt.Errorf("$ref %q points at nothing", clip(ref))
			}
			cur = c[i]
		default:
			return nil, fmt.Errorf("$ref %q points at nothing", clip(ref))
		}
	}
	return cur, nil
}

func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "…"
	}
	return s
}
