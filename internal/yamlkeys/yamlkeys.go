// Package yamlkeys checks a YAML document's keys against the Go type it
// decodes into, naming an unknown key by its full path and line. sluice.yaml
// and sandboxd.yaml share it so both report a typo the same way.
package yamlkeys

import (
	"fmt"
	"reflect"
	"strings"

	"go.yaml.in/yaml/v3"
)

// UnknownKeyError names a key the type has no field for, and its line.
type UnknownKeyError struct {
	Path string
	Line int
}

func (e *UnknownKeyError) Error() string {
	return fmt.Sprintf("%s: unknown key (line %d)", e.Path, e.Line)
}

// Check walks n against t and reports the first key t has no field for, by
// its full path (prefixed by path), so a typo is named where it is. A node
// whose kind does not fit t is left to the decoder's type error.
func Check(n *yaml.Node, t reflect.Type, path string) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yaml.MappingNode {
			return nil
		}
		fields := map[string]reflect.Type{}
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
			if name == "" || name == "-" {
				continue
			}
			fields[name] = f.Type
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := k.Value
			if path != "" {
				p = path + "." + k.Value
			}
			ft, ok := fields[k.Value]
			if !ok {
				return &UnknownKeyError{Path: p, Line: k.Line}
			}
			if err := Check(v, ft, p); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			return nil
		}
		for i, v := range n.Content {
			if err := Check(v, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	}
	return nil
}
