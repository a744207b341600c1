package audit

import (
	"bytes"
	"encoding/json"
	"net/http"
	"testing"
)

func TestAppendJSONValueIsMarshal(t *testing.T) {
	var doc any
	dec := json.NewDecoder(bytes.NewReader([]byte(`{"z":{},"a":[],"m":"\u2028é\ud800<&>","n":-0.0e+1,"l":[1,"x",null,true,false,{"b":1,"a":2}]}`)))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	for _, v := range []any{
		doc, nil, true, "s\xff", json.Number("12"), []any(nil), map[string]any(nil), []any{}, map[string]any{},
		json.Number(""), json.Number("1x"), 1.5, map[string]any{"f": 0.1, "i": 3}, // left to json.Marshal
		map[string]any{"k0": 0, "k1": 1, "k2": 2, "k3": 3, "k4": 4, "k5": 5, "k6": 6, "k7": 7, "k8": 8, "k9": 9, "ka": 10, "kb": 11, "kc": 12, "kd": 13, "ke": 14, "kf": 15, "kg": 16},
	} {
		want, werr := json.Marshal(v)
		got, gerr := AppendJSONValue(nil, v)
		if (werr != nil) != (gerr != nil) || !bytes.Equal(got, want) {
			t.Errorf("AppendJSONValue(%#v) = %s, %v; json.Marshal: %s, %v", v, got, gerr, want, werr)
		}
	}
	for _, m := range []map[string][]string{nil, {}, {"B": {"1", "<"}, "a": nil, "c": {}}, http.Header{"X": {"y"}}} {
		want, _ := json.Marshal(m)
		if got := AppendJSONStringLists(nil, m); !bytes.Equal(got, want) {
			t.Errorf("AppendJSONStringLists(%#v) = %s; json.Marshal: %s", m, got, want)
		}
	}
}
