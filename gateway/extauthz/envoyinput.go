package extauthz

import (
	"bytes"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"strings"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/encoding/protojson"
)

// EnvoyInput builds input.envoy: the CheckRequest in the input shape of
// opa-envoy-plugin (envoyauth.RequestToInput), so that a policy written for
// it reads the same fields here:
//
//   - attributes: the CheckRequest's attributes as protojson renders them
//     (lowerCamelCase names: attributes.request.http.method,
//     attributes.source.principal, attributes.contextExtensions);
//   - parsed_path: the path's segments, without the leading '/';
//   - parsed_query: the query, names to arrays of values;
//   - parsed_body: the JSON or form body when Envoy sent it whole, else null;
//   - truncated_body: Envoy sent less than Content-Length;
//   - version: {"ext_authz": "v3", "encoding": "protojson"}.
//
// Numbers stay json.Number, as opa-envoy-plugin keeps them.
func EnvoyInput(cr *authv3.CheckRequest, r *Request) (map[string]any, error) {
	raw, err := protojson.Marshal(cr)
	if err != nil {
		return nil, fmt.Errorf("extauthz: envoy input: %w", err)
	}
	in := map[string]any{}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	if err := dec.Decode(&in); err != nil {
		return nil, fmt.Errorf("extauthz: envoy input: %w", err)
	}
	if _, ok := in["attributes"]; !ok {
		in["attributes"] = map[string]any{}
	}
	in["version"] = map[string]any{"ext_authz": "v3", "encoding": "protojson"}
	segs := []any{}
	for _, s := range strings.Split(strings.TrimLeft(r.Path, "/"), "/") {
		if u, err := url.PathUnescape(s); err == nil {
			s = u
		}
		segs = append(segs, s)
	}
	in["parsed_path"] = segs
	q := map[string]any{}
	for k, vs := range r.Query {
		a := make([]any, len(vs))
		for i, v := range vs {
			a[i] = v
		}
		q[k] = a
	}
	in["parsed_query"] = q
	in["parsed_body"] = nil
	in["truncated_body"] = r.BodyTruncated
	if len(r.Body) > 0 && !r.BodyTruncated {
		mt, _, _ := mime.ParseMediaType(r.Headers.Get("Content-Type"))
		switch {
		case mt == "application/json" || strings.HasSuffix(mt, "+json"):
			var v any
			d := json.NewDecoder(bytes.NewReader(r.Body))
			d.UseNumber()
			if d.Decode(&v) == nil && !d.More() {
				in["parsed_body"] = v
			}
		case mt == "application/x-www-form-urlencoded":
			if f, err := url.ParseQuery(string(r.Body)); err == nil {
				m := map[string]any{}
				for k, vs := range f {
					a := make([]any, len(vs))
					for i, v := range vs {
						a[i] = v
					}
					m[k] = a
				}
				in["parsed_body"] = m
			}
		}
	}
	return in, nil
}
