package extauthz

import (
	"encoding/base64"
	"encoding/json"
	"strconv"

	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"

	"github.com/sluice-gw/sluice/gateway/audit"
)

// EnvoyJSON is input.envoy as the gateway hands it to policy and records
// it: EnvoyInput's document encoded exactly as json.Marshal encodes it
// (keys sorted, compact, HTML-escaped), without reflection. The decision
// parses these bytes once (policy.ParseJSON) and the recorded input
// carries them as they are, where a map was converted to policy's value
// and encoded again per Check. TestEnvoyJSONMatchesMarshal holds the two
// encodings to the same bytes.
//
// The attributes Envoy's HTTP filter usually sends (fastAttributes's)
// are written straight from the CheckRequest (appendAttributes), without
// the map; the rest of the document is EnvoyInput's.
func EnvoyJSON(cr *authv3.CheckRequest, r *Request) (json.RawMessage, error) {
	dst := append(make([]byte, 0, 1024), `{"attributes":`...)
	dst, ok := appendAttributes(dst, cr.GetAttributes())
	if !ok {
		in, err := EnvoyInput(cr, r)
		if err != nil {
			return nil, err
		}
		return audit.AppendJSONValue(dst[:0], in)
	}
	rest := make(map[string]any, 5)
	envoyRest(rest, r)
	at := len(dst)
	dst, err := audit.AppendJSONValue(dst, rest) // its keys all sort after "attributes"
	if err != nil {
		return nil, err
	}
	dst[at] = ',' // the rest's '{' continues the document
	return dst, nil
}

// appendAttributes appends fastAttributes(a) as json.Marshal encodes it,
// without building it; ok false where fastAttributes's is false.
func appendAttributes(dst []byte, a *authv3.AttributeContext) ([]byte, bool) {
	if a == nil {
		return append(dst, "{}"...), true
	}
	if a.GetTlsSession() != nil || len(a.GetMetadataContext().GetFilterMetadata()) > 0 || len(a.GetMetadataContext().GetTypedFilterMetadata()) > 0 ||
		len(a.GetRouteMetadataContext().GetFilterMetadata()) > 0 || len(a.GetRouteMetadataContext().GetTypedFilterMetadata()) > 0 {
		return dst, false
	}
	// Keys in json.Marshal's order.
	o := object{dst: append(dst, '{')}
	o.strMap("contextExtensions", a.GetContextExtensions())
	if p := a.GetDestination(); p != nil {
		o.key("destination")
		var ok bool
		if o.dst, ok = appendPeer(o.dst, p); !ok {
			return dst, false
		}
	}
	if a.GetMetadataContext() != nil {
		o.key("metadataContext")
		o.dst = append(o.dst, "{}"...)
	}
	if req := a.GetRequest(); req != nil {
		o.key("request")
		ro := object{dst: append(o.dst, '{')}
		if h := req.GetHttp(); h != nil {
			if h.GetHeaderMap() != nil {
				return dst, false
			}
			ro.key("http")
			ho := object{dst: append(ro.dst, '{')}
			ho.str("body", h.GetBody())
			ho.str("fragment", h.GetFragment())
			ho.strMap("headers", h.GetHeaders())
			ho.str("host", h.GetHost())
			ho.str("id", h.GetId())
			ho.str("method", h.GetMethod())
			ho.str("path", h.GetPath())
			ho.str("protocol", h.GetProtocol())
			ho.str("query", h.GetQuery())
			if b := h.GetRawBody(); len(b) > 0 {
				ho.key("rawBody")
				ho.dst = append(ho.dst, '"')
				ho.dst = base64.StdEncoding.AppendEncode(ho.dst, b)
				ho.dst = append(ho.dst, '"')
			}
			ho.str("scheme", h.GetScheme())
			if n := h.GetSize(); n != 0 {
				ho.key("size")
				ho.dst = append(strconv.AppendInt(append(ho.dst, '"'), n, 10), '"') // int64: a string in protojson
			}
			ro.dst = append(ho.dst, '}')
		}
		if t := req.GetTime(); t != nil {
			if t.CheckValid() != nil {
				return dst, false
			}
			ro.str("time", t.AsTime().UTC().Format(protoTime(t.GetNanos())))
		}
		o.dst = append(ro.dst, '}')
	}
	if a.GetRouteMetadataContext() != nil {
		o.key("routeMetadataContext")
		o.dst = append(o.dst, "{}"...)
	}
	if p := a.GetSource(); p != nil {
		o.key("source")
		var ok bool
		if o.dst, ok = appendPeer(o.dst, p); !ok {
			return dst, false
		}
	}
	return append(o.dst, '}'), true
}

// appendPeer is fastPeer's document, encoded.
func appendPeer(dst []byte, p *authv3.AttributeContext_Peer) ([]byte, bool) {
	o := object{dst: append(dst, '{')}
	if ad := p.GetAddress(); ad != nil {
		o.key("address")
		ao := object{dst: append(o.dst, '{')}
		switch {
		case ad.GetSocketAddress() != nil:
			sa := ad.GetSocketAddress()
			if sa.GetProtocol() != 0 || sa.GetNamedPort() != "" || sa.GetResolverName() != "" || sa.GetIpv4Compat() || sa.GetNetworkNamespaceFilepath() != "" {
				return dst, false
			}
			ao.key("socketAddress")
			so := object{dst: append(ao.dst, '{')}
			so.str("address", sa.GetAddress())
			if pv := sa.GetPortValue(); pv != 0 {
				so.key("portValue")
				so.dst = strconv.AppendUint(so.dst, uint64(pv), 10)
			}
			ao.dst = append(so.dst, '}')
		case ad.GetPipe() != nil:
			ao.key("pipe")
			po := object{dst: append(ao.dst, '{')}
			if md := ad.GetPipe().GetMode(); md != 0 {
				po.key("mode")
				po.dst = strconv.AppendUint(po.dst, uint64(md), 10)
			}
			po.str("path", ad.GetPipe().GetPath())
			ao.dst = append(po.dst, '}')
		case ad.GetAddress() == nil:
		default:
			return dst, false
		}
		o.dst = append(ao.dst, '}')
	}
	o.str("certificate", p.GetCertificate())
	o.strMap("labels", p.GetLabels())
	o.str("principal", p.GetPrincipal())
	o.str("service", p.GetService())
	return append(o.dst, '}'), true
}

// object writes an object's members after its '{'.
type object struct {
	dst  []byte
	more bool
}

func (o *object) key(k string) {
	if o.more {
		o.dst = append(o.dst, ',')
	}
	o.more = true
	o.dst = audit.AppendJSONString(o.dst, k)
	o.dst = append(o.dst, ':')
}

// str writes k: v, or nothing for an empty v (fastAttributes leaves
// empty strings out, as protojson does).
func (o *object) str(k, v string) {
	if v != "" {
		o.key(k)
		o.dst = audit.AppendJSONString(o.dst, v)
	}
}

// strMap writes k: m as json.Marshal encodes a map[string]any of
// strings, or nothing for an empty m (as fastAttributes).
func (o *object) strMap(k string, m map[string]string) {
	if len(m) > 0 {
		o.key(k)
		o.dst = audit.AppendJSONStringMap(o.dst, m)
	}
}
