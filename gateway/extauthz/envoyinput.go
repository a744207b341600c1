package extauthz

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"mime"
	"net/url"
	"strconv"
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
	in := map[string]any{}
	if attrs, ok := fastAttributes(cr.GetAttributes()); ok {
		in["attributes"] = attrs
	} else {
		raw, err := protojson.Marshal(cr)
		if err != nil {
			return nil, fmt.Errorf("extauthz: envoy input: %w", err)
		}
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&in); err != nil {
			return nil, fmt.Errorf("extauthz: envoy input: %w", err)
		}
		if _, ok := in["attributes"]; !ok {
			in["attributes"] = map[string]any{}
		}
	}
	envoyRest(in, r)
	return in, nil
}

// envoyRest puts the members of input.envoy after attributes in in:
// version, parsed_path, parsed_query, parsed_body, truncated_body.
func envoyRest(in map[string]any, r *Request) {
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
}

// fastAttributes renders the attributes of a CheckRequest as protojson
// would and encoding/json would decode them (UseNumber), without the round
// trip, for what Envoy's HTTP filter usually sends: peers with socket or
// pipe addresses, principals, services, labels and certificates, the HTTP
// request with its headers map and body, context_extensions, and empty
// metadata. Anything else (metadata with content, a raw header map, a TLS
// session, other address kinds) returns ok false and takes protojson's
// path; TestFastAttributesMatchProtojson holds the two to the same
// document.
func fastAttributes(a *authv3.AttributeContext) (map[string]any, bool) {
	out := map[string]any{}
	if a == nil {
		return out, true
	}
	if a.GetTlsSession() != nil || len(a.GetMetadataContext().GetFilterMetadata()) > 0 || len(a.GetMetadataContext().GetTypedFilterMetadata()) > 0 ||
		len(a.GetRouteMetadataContext().GetFilterMetadata()) > 0 || len(a.GetRouteMetadataContext().GetTypedFilterMetadata()) > 0 {
		return nil, false
	}
	for _, p := range []struct {
		key  string
		peer *authv3.AttributeContext_Peer
	}{{"source", a.GetSource()}, {"destination", a.GetDestination()}} {
		if p.peer == nil {
			continue
		}
		m, ok := fastPeer(p.peer)
		if !ok {
			return nil, false
		}
		out[p.key] = m
	}
	if req := a.GetRequest(); req != nil {
		rm := map[string]any{}
		if t := req.GetTime(); t != nil {
			if t.CheckValid() != nil {
				return nil, false
			}
			rm["time"] = t.AsTime().UTC().Format(protoTime(t.GetNanos()))
		}
		if h := req.GetHttp(); h != nil {
			if h.GetHeaderMap() != nil {
				return nil, false
			}
			hm := map[string]any{}
			for k, v := range map[string]string{"id": h.GetId(), "method": h.GetMethod(), "path": h.GetPath(), "host": h.GetHost(),
				"scheme": h.GetScheme(), "query": h.GetQuery(), "fragment": h.GetFragment(), "protocol": h.GetProtocol(), "body": h.GetBody()} {
				if v != "" {
					hm[k] = v
				}
			}
			if hs := h.GetHeaders(); len(hs) > 0 {
				hm["headers"] = anyMap(hs)
			}
			if n := h.GetSize(); n != 0 {
				hm["size"] = strconv.FormatInt(n, 10) // int64: a string in protojson
			}
			if b := h.GetRawBody(); len(b) > 0 {
				hm["rawBody"] = base64.StdEncoding.EncodeToString(b)
			}
			rm["http"] = hm
		}
		out["request"] = rm
	}
	if ce := a.GetContextExtensions(); len(ce) > 0 {
		out["contextExtensions"] = anyMap(ce)
	}
	if a.GetMetadataContext() != nil {
		out["metadataContext"] = map[string]any{}
	}
	if a.GetRouteMetadataContext() != nil {
		out["routeMetadataContext"] = map[string]any{}
	}
	return out, true
}

func fastPeer(p *authv3.AttributeContext_Peer) (map[string]any, bool) {
	m := map[string]any{}
	if ad := p.GetAddress(); ad != nil {
		am := map[string]any{}
		switch {
		case ad.GetSocketAddress() != nil:
			sa := ad.GetSocketAddress()
			if sa.GetProtocol() != 0 || sa.GetNamedPort() != "" || sa.GetResolverName() != "" || sa.GetIpv4Compat() || sa.GetNetworkNamespaceFilepath() != "" {
				return nil, false
			}
			sm := map[string]any{}
			if sa.GetAddress() != "" {
				sm["address"] = sa.GetAddress()
			}
			if pv := sa.GetPortValue(); pv != 0 {
				sm["portValue"] = json.Number(strconv.FormatUint(uint64(pv), 10))
			}
			am["socketAddress"] = sm
		case ad.GetPipe() != nil:
			pm := map[string]any{}
			if ad.GetPipe().GetPath() != "" {
				pm["path"] = ad.GetPipe().GetPath()
			}
			if md := ad.GetPipe().GetMode(); md != 0 {
				pm["mode"] = json.Number(strconv.FormatUint(uint64(md), 10))
			}
			am["pipe"] = pm
		case ad.GetAddress() == nil:
		default:
			return nil, false
		}
		m["address"] = am
	}
	for k, v := range map[string]string{"service": p.GetService(), "principal": p.GetPrincipal(), "certificate": p.GetCertificate()} {
		if v != "" {
			m[k] = v
		}
	}
	if ls := p.GetLabels(); len(ls) > 0 {
		m["labels"] = anyMap(ls)
	}
	return m, true
}

// protoTime is the layout protojson writes a Timestamp in: 0, 3, 6 or 9
// fractional digits, as many as the nanoseconds need.
func protoTime(nanos int32) string {
	switch {
	case nanos == 0:
		return "2006-01-02T15:04:05Z"
	case nanos%1e6 == 0:
		return "2006-01-02T15:04:05.000Z"
	case nanos%1e3 == 0:
		return "2006-01-02T15:04:05.000000Z"
	}
	return "2006-01-02T15:04:05.000000000Z"
}

// anyMap is a string map as encoding/json decodes a JSON object.
func anyMap(in map[string]string) map[string]any {
	m := make(map[string]any, len(in))
	for k, v := range in {
		m[k] = v
	}
	return m
}
