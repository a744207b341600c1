//go:build linux

package e2e

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"io"
	"mime"
	"mime/multipart"
	"net/http"
	"net/url"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// serialGateway runs the gateway with connectors/testdata/serial-3.0.yaml
// as the tickets connector (same slug, credential and upstream), every
// serial tool allowed.
func serialGateway(t *testing.T, edit ...func(gwenv.Doc)) (*gwenv.Env, *gwenv.Gateway) {
	t.Helper()
	e := newEnv(t)
	spec, err := filepath.Abs("../../connectors/testdata/serial-3.0.yaml")
	if err != nil {
		t.Fatal(err)
	}
	e.Spec = spec
	d := mainConfig(e, "sluice")
	d["policies"] = []map[string]any{
		{"match": "tickets.create_customer", "action": "allow"},
		{"match": "tickets.search", "action": "allow"},
		{"match": "tickets.get_content", "action": "allow"},
		{"match": "tickets.upload_file", "action": "allow"},
		{"match": "tickets.put_blob", "action": "allow"},
		{"match": "*", "action": "block"},
	}
	for _, f := range edit {
		f(d)
	}
	return e, e.Start(d, e.Write(d))
}

// TestSerialisation: calls through the real binary reach a recording
// upstream encoded as the spec's style and encoding say, and read back
// there (Go's form and multipart parsers) as the values the agent sent.
func TestSerialisation(t *testing.T) {
	t.Parallel()
	e, g := serialGateway(t)
	png := []byte("\x89PNG\r\n\x1a\n\x00\xff upload")

	cases := []struct {
		name, tool, args string
		check            func(t *testing.T, s gwenv.Seen)
	}{
		{"form encoding: deepObject, arrays, nested", "tickets.create_customer",
			`{"body":{"name":"Ada","expand":["customer","items.data"],"metadata":{"order":"6735"},` +
				`"items":[{"price":"p1","quantity":2},{"price":"p2"}],"address":{"line1":"1 Main","geo":{"lat":1.5}},"tags":["x","y"]}}`,
			func(t *testing.T, s gwenv.Seen) {
				if ct := s.Header.Get("Content-Type"); ct != "application/x-www-form-urlencoded" {
					t.Errorf("Content-Type = %q", ct)
				}
				got, err := url.ParseQuery(s.Body)
				want := url.Values{
					"name": {"Ada"}, "expand[]": {"customer", "items.data"}, "metadata[order]": {"6735"},
					"items[0][price]": {"p1"}, "items[0][quantity]": {"2"}, "items[1][price]": {"p2"},
					"address[line1]": {"1 Main"}, "address[geo][lat]": {"1.5"}, "tags": {"x", "y"},
				}
				if err != nil || !reflect.DeepEqual(got, want) {
					t.Errorf("upstream form = %v (%v), want %v; body %q", got, err, want, s.Body)
				}
			}},
		{"deepObject query arrays and allowReserved query", "tickets.search",
			`{"query":{"filter":{"tags":["a","b"],"rows":[{"x":"y"}]},"q":"repo:o/r is:open"}}`,
			func(t *testing.T, s gwenv.Seen) {
				want := "/v1/search?filter%5Brows%5D%5B0%5D%5Bx%5D=y&filter%5Btags%5D%5B%5D=a&filter%5Btags%5D%5B%5D=b&q=repo:o/r%20is:open"
				if s.RequestURI != want {
					t.Errorf("RequestURI = %q, want %q", s.RequestURI, want)
				}
				u, _ := url.ParseRequestURI(s.RequestURI)
				if q := u.Query(); !reflect.DeepEqual(q["filter[tags][]"], []string{"a", "b"}) || q.Get("q") != "repo:o/r is:open" {
					t.Errorf("upstream query = %v", q)
				}
			}},
		{"allowReserved path spans segments", "tickets.get_content",
			`{"path":{"owner":"octo","repo":"hello","path":"src/cmd/main.go"}}`,
			func(t *testing.T, s gwenv.Seen) {
				if s.EscapedPath != "/repos/octo/hello/contents/src/cmd/main.go" {
					t.Errorf("path = %q", s.EscapedPath)
				}
			}},
		{"multipart upload", "tickets.upload_file",
			`{"body":{"file":"` + base64.StdEncoding.EncodeToString(png) + `","file_filename":"a \"b\".png","purpose":"avatar","meta":{"k":"v"}}}`,
			func(t *testing.T, s gwenv.Seen) {
				mt, params, err := mime.ParseMediaType(s.Header.Get("Content-Type"))
				if err != nil || mt != "multipart/form-data" {
					t.Fatalf("Content-Type = %q (%v)", s.Header.Get("Content-Type"), err)
				}
				r := multipart.NewReader(strings.NewReader(s.Body), params["boundary"])
				var got []string
				for {
					p, err := r.NextPart()
					if err == io.EOF {
						break
					}
					if err != nil {
						t.Fatalf("upstream multipart reader: %v", err)
					}
					data, _ := io.ReadAll(p)
					if p.FormName() == "file" && !bytes.Equal(data, png) {
						t.Errorf("file part bytes = %q, want %q", data, png)
					}
					got = append(got, strings.Join([]string{p.FormName(), p.FileName(), p.Header.Get("Content-Type"), strconv.Itoa(len(data))}, "|"))
				}
				want := []string{"file|a \"b\".png|image/png|" + strconv.Itoa(len(png)), "meta||application/json|9", "purpose|||6"}
				if !reflect.DeepEqual(got, want) {
					t.Errorf("upstream parts = %q, want %q", got, want)
				}
			}},
		{"binary body", "tickets.put_blob", `{"path":{"name":"b1"},"body":"AAEC/w=="}`,
			func(t *testing.T, s gwenv.Seen) {
				if s.Header.Get("Content-Type") != "application/octet-stream" || s.Body != "\x00\x01\x02\xff" {
					t.Errorf("upstream got %q %q", s.Header.Get("Content-Type"), s.Body)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := len(e.Up.Requests())
			r := g.For(t).Call(agentA, tc.tool, tc.args)
			if r.Status != http.StatusOK {
				t.Fatalf("call: %d %s %s", r.Status, r.Code, r.Body)
			}
			reqs := e.Up.Requests()[before:]
			if len(reqs) != 1 {
				t.Fatalf("upstream saw %d requests, want 1", len(reqs))
			}
			if reqs[0].Header.Get("X-Api-Key") != e.Secret {
				t.Errorf("credential not attached where the scheme says (X-Api-Key)")
			}
			tc.check(t, reqs[0])
			wantFields(t, awaitDecision(t, g, r.RequestID), map[string]string{"decision": "allow", "tool": tc.tool})
		})
	}
}

// TestSerialisationSmuggling is F10: values that would change what the
// upstream reads once serialised are refused before policy, with nothing
// sent and the refusal audited.
func TestSerialisationSmuggling(t *testing.T) {
	t.Parallel()
	e, g := serialGateway(t)
	cases := []struct {
		name, tool, args, field, reason string
	}{
		{"allowReserved path with .. segments (CWE-22)", "tickets.get_content", `{"path":{"owner":"o","repo":"r","path":"a/../../../admin"}}`, "path.path", "dot segment"},
		{"allowReserved path with %2e%2e (CVE-2021-41773)", "tickets.get_content", `{"path":{"owner":"o","repo":"r","path":"a/%2e%2e/admin"}}`, "path.path", "dot segment"},
		{"allowReserved path with %252e%252e (CVE-2021-42013)", "tickets.get_content", `{"path":{"owner":"o","repo":"r","path":"a/%252e%252e/admin"}}`, "path.path", "dot segment"},
		{"allowReserved path with an empty segment", "tickets.get_content", `{"path":{"owner":"o","repo":"r","path":"/etc/passwd"}}`, "path.path", "empty segment"},
		{"allowReserved path with a backslash", "tickets.get_content", `{"path":{"owner":"o","repo":"r","path":"a\\..\\admin"}}`, "path.path", `"?" or "#"`},
		{"exploded query object posing as limit", "tickets.search", `{"query":{"limit":5,"opts":{"limit":"1000"}}}`, "query.opts.limit", "must not read as another value's name"},
		{"exploded form object posing as amount", "tickets.create_customer", `{"body":{"name":"a","extra":{"amount":"1000"}}}`, "body.extra.amount", "must not read as another value's name"},
		{"deepObject key with brackets", "tickets.create_customer", `{"body":{"name":"a","metadata":{"x][amount":"1"}}}`, "body.metadata.x][amount", "hold no [ or ]"},
		{"CR LF in a multipart filename (header injection)", "tickets.upload_file", `{"body":{"file":"AA==","file_filename":"a\r\nContent-Type: text/html","purpose":"avatar"}}`, "body.file_filename", "control characters"},
		{"file not base64", "tickets.upload_file", `{"body":{"file":"a\r\n--x","purpose":"avatar"}}`, "body.file", "not base64"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "F10", tc.name+": "+tc.tool+" "+tc.args,
				"400 schema_violation naming "+strconv.Quote(tc.field)+" ("+tc.reason+"), no policy decision, nothing upstream, audited")
			before, acc := len(e.Up.Requests()), e.Up.Accepts.Load()
			r := g.For(t).Call(agentA, tc.tool, tc.args)
			defer func() {
				c.Observef("%d %s %q, upstream requests +%d, connections +%d", r.Status, r.Code, r.Message,
					len(e.Up.Requests())-before, e.Up.Accepts.Load()-acc)
			}()
			expect(t, r, http.StatusBadRequest, "schema_violation")
			if !strings.Contains(r.Message, tc.field) || !strings.Contains(r.Message, tc.reason) {
				t.Errorf("message %q does not name %q and %q", r.Message, tc.field, tc.reason)
			}
			if len(e.Up.Requests()) != before || e.Up.Accepts.Load() != acc {
				t.Errorf("upstream was reached")
			}
			line := awaitDecision(t, g, r.RequestID)
			wantFields(t, line, map[string]string{"decision": ""})
			var audited bool
			for _, rec := range g.AuditRecords() {
				f, _ := rec["fields"].(map[string]any)
				if rec["request_id"] == r.RequestID && f["code"] == "schema_violation" && f["tool"] == tc.tool {
					audited = true
				}
			}
			if !audited {
				b, _ := json.Marshal(g.AuditRecords())
				t.Errorf("no audit record with code schema_violation for %s: %s", r.RequestID, b)
			}
		})
	}
}

// TestHeldUpload is E4 for a multipart upload: the body is a function of
// the arguments, so a held upload re-sent with Sluice-Hold and the same
// arguments is the same hold (a random boundary would make it 409), one
// with another file is 409 args_mismatch, and the approved upload reaches
// the upstream once, as the approver saw it.
func TestHeldUpload(t *testing.T) {
	t.Parallel()
	e, g := serialGateway(t, func(d gwenv.Doc) {
		d.Rule("tickets.upload_file")["action"] = "ask"
		d.Rule("tickets.upload_file")["approvers"] = []string{"group:finance"}
		d.Gateway()["hold_wait"] = "100ms"
		sum := sha256.Sum256([]byte(gwenv.CarolToken))
		d["approvers"] = map[string]any{"users": []map[string]any{{"name": "carol", "groups": []string{"finance"}, "token_sha256": hex.EncodeToString(sum[:])}}}
	})
	c := casebook.Expect(t, "E4", "multipart upload held, re-sent with Sluice-Hold: same file, then another file",
		"same arguments: the same pending hold (202); another file: 409 args_mismatch; approved: one upstream upload with the held bytes")
	var obs []string
	defer func() { c.Observe(strings.Join(obs, "; ")) }()

	args := `{"body":{"file":"iVBORw0KGgo=","file_filename":"a.png","purpose":"avatar"}}`
	r := g.For(t).Call(agentA, "tickets.upload_file", args)
	var held struct {
		Hold struct{ ID, Status, Poll string } `json:"hold"`
	}
	if err := json.Unmarshal(r.Body, &held); err != nil || r.Status != http.StatusAccepted || held.Hold.ID == "" {
		t.Fatalf("ask: %d %s, want 202 pending", r.Status, r.Body)
	}
	resend := func(a string) gwenv.Reply {
		return g.For(t).Do(agentA, http.MethodPost, "/v1/tools/tickets.upload_file", a, http.Header{"Sluice-Hold": {held.Hold.ID}})
	}
	same := resend(args)
	obs = append(obs, "same arguments "+strconv.Itoa(same.Status)+" "+same.Code)
	if same.Status != http.StatusAccepted {
		t.Fatalf("re-send with the same arguments: %d %s, want 202 (the same hold)", same.Status, same.Body)
	}
	other := resend(`{"body":{"file":"AAAA","file_filename":"a.png","purpose":"avatar"}}`)
	obs = append(obs, "another file "+strconv.Itoa(other.Status)+" "+other.Code)
	expect(t, other, http.StatusConflict, "args_mismatch")

	st, _, body := g.AdminDo(http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/approve", gwenv.CarolToken, `{"reason":"ok"}`)
	obs = append(obs, "approve "+strconv.Itoa(st))
	if h, _ := body["hold"].(map[string]any); st != http.StatusOK || h["status"] != "executed" {
		t.Fatalf("approve: %d %v", st, body)
	}
	reqs := e.Up.Requests()
	obs = append(obs, "upstream requests "+strconv.Itoa(len(reqs)))
	if len(reqs) != 1 || reqs[0].Path != "/v1/files" || reqs[0].Header.Get("X-Api-Key") != e.Secret {
		t.Fatalf("upstream saw %d requests; want one POST /v1/files with the credential", len(reqs))
	}
	_, params, _ := mime.ParseMediaType(reqs[0].Header.Get("Content-Type"))
	p, err := multipart.NewReader(strings.NewReader(reqs[0].Body), params["boundary"]).NextPart()
	if err != nil {
		t.Fatalf("upstream multipart: %v", err)
	}
	data, _ := io.ReadAll(p)
	if p.FormName() != "file" || p.FileName() != "a.png" || !bytes.Equal(data, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("upstream file part %q %q %q", p.FormName(), p.FileName(), data)
	}
	done := resend(args)
	obs = append(obs, "re-send after approval "+strconv.Itoa(done.Status))
	if done.Status != http.StatusOK || len(e.Up.Requests()) != 1 {
		t.Errorf("re-send after approval: %d, upstream requests %d; want the stored result and no second upload", done.Status, len(e.Up.Requests()))
	}
}
