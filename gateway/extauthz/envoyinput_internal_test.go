package extauthz

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	authv3 "github.com/envoyproxy/go-control-plane/envoy/service/auth/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// slowAttributes is opa-envoy-plugin's way: protojson, then encoding/json
// with UseNumber.
func slowAttributes(t *testing.T, cr *authv3.CheckRequest) any {
	t.Helper()
	raw, err := protojson.Marshal(cr)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	d := json.NewDecoder(bytes.NewReader(raw))
	d.UseNumber()
	if err := d.Decode(&m); err != nil {
		t.Fatal(err)
	}
	if m["attributes"] == nil {
		return map[string]any{}
	}
	return m["attributes"]
}

// fixtures are the CheckRequests in testdata, as Envoy sends them.
func fixtures(t *testing.T) []*authv3.CheckRequest {
	t.Helper()
	files, _ := filepath.Glob("testdata/*.json")
	var crs []*authv3.CheckRequest
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		cr := &authv3.CheckRequest{}
		if err := protojson.Unmarshal(b, cr); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		crs = append(crs, cr)
	}
	if len(crs) < 3 {
		t.Fatalf("%d fixtures", len(crs))
	}
	return crs
}

// TestFastAttributesMatchProtojson: the direct rendering of attributes is
// protojson's document, field for field, for every fixture and for the
// fields Envoy fills less often; what it does not render falls back.
func TestFastAttributesMatchProtojson(t *testing.T) {
	crs := fixtures(t)
	rich := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{
		Source: &authv3.AttributeContext_Peer{
			Address: &corev3.Address{Address: &corev3.Address_Pipe{Pipe: &corev3.Pipe{Path: "/run/x.sock", Mode: 0o660}}},
			Service: "sb", Principal: "spiffe://td/a", Certificate: "-----BEGIN%20CERTIFICATE-----", Labels: map[string]string{"app": "agent"},
		},
		Destination: &authv3.AttributeContext_Peer{Address: &corev3.Address{}},
		Request: &authv3.AttributeContext_Request{
			Time: timestamppb.New(time.Date(2026, 12, 2, 3, 4, 5, 120000000, time.UTC)),
			Http: &authv3.AttributeContext_HttpRequest{Method: "PUT", Body: "text body", Size: -1, Fragment: "", Query: ""},
		},
	}}
	crs = append(crs, rich, &authv3.CheckRequest{}, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{}})
	for _, n := range []int32{0, 1, 1000, 1000000, 123456789} {
		crs = append(crs, &authv3.CheckRequest{Attributes: &authv3.AttributeContext{Request: &authv3.AttributeContext_Request{Time: &timestamppb.Timestamp{Seconds: 1764644645, Nanos: n}}}})
	}
	for i, cr := range crs {
		fast, ok := fastAttributes(cr.GetAttributes())
		if !ok {
			t.Errorf("case %d: not rendered directly", i)
			continue
		}
		if slow := slowAttributes(t, cr); !reflect.DeepEqual(any(fast), slow) {
			fb, _ := json.Marshal(fast)
			sb, _ := json.Marshal(slow)
			t.Errorf("case %d differs:\nfast %s\nslow %s", i, fb, sb)
		}
		// EnvoyJSON writes the same document without the map.
		want, _ := json.Marshal(fast)
		if got, ok := appendAttributes(nil, cr.GetAttributes()); !ok || string(got) != string(want) {
			t.Errorf("case %d: appendAttributes (ok %v)\n got %s\nwant %s", i, ok, got, want)
		}
	}
	// Metadata with content is left to protojson.
	md, _ := structpb.NewStruct(map[string]any{"k": "v"})
	withMD := &authv3.CheckRequest{Attributes: &authv3.AttributeContext{MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"f": md}}}}
	if _, ok := fastAttributes(withMD.GetAttributes()); ok {
		t.Error("metadata with content was rendered directly")
	}
	if _, ok := appendAttributes(nil, withMD.GetAttributes()); ok {
		t.Error("metadata with content was encoded directly")
	}
	r := &Request{}
	in, err := EnvoyInput(withMD, r)
	if err != nil || !reflect.DeepEqual(in["attributes"], slowAttributes(t, withMD)) {
		t.Errorf("fallback: %v %v", in["attributes"], err)
	}
}
