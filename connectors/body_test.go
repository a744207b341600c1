package connectors

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// serialTool loads testdata/serial-3.0.yaml and returns one of its tools.
func serialTool(t *testing.T, name string) (*Connector, *Tool) {
	t.Helper()
	c := mustLoad(t, "serial", "testdata/serial-3.0.yaml")
	return c, tool(t, c, "serial."+name)
}

// send validates args and builds the request, failing on either error.
func send(t *testing.T, c *Connector, tl *Tool, args string) (url, contentType string, body []byte) {
	t.Helper()
	a := decode(t, args)
	if err := tl.Validate(a); err != nil {
		t.Fatalf("validate: %v", err)
	}
	req, err := tl.NewRequest(context.Background(), c.BaseURL, a)
	if err != nil {
		t.Fatalf("new request: %v", err)
	}
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
	}
	return req.URL.String(), req.Header.Get("Content-Type"), body
}

// refused asserts that Validate and NewRequest both refuse args naming
// field: the encoder refuses exactly what Validate refuses.
func refused(t *testing.T, c *Connector, tl *Tool, args, field string) {
	t.Helper()
	a := decode(t, args)
	var ae *ArgError
	if err := tl.Validate(a); !errors.As(err, &ae) || ae.Field != field {
		t.Errorf("Validate = %v, want ArgError %s", err, field)
	}
	if _, err := tl.NewRequest(context.Background(), c.BaseURL, a); !errors.As(err, &ae) || ae.Field != field {
		t.Errorf("NewRequest = %v, want ArgError %s", err, field)
	}
}

// TestFormEncoding: a form body follows the media type's encoding map
// (OpenAPI 3.0.3 §4.7.14.5) as Stripe's spec writes it and Stripe reads it.
func TestFormEncoding(t *testing.T) {
	c, tl := serialTool(t, "create_customer")
	if tl.BodyType != formType {
		t.Fatalf("BodyType = %q, want %q", tl.BodyType, formType)
	}
	cases := []struct {
		name string
		body string
		want string
	}{
		{"deepObject array of scalars (Stripe expand[])", `{"name":"a","expand":["customer","items.data"]}`,
			"expand%5B%5D=customer&expand%5B%5D=items.data&name=a"},
		{"deepObject object (Stripe metadata[key])", `{"name":"a","metadata":{"order":"6735","k y":"v&w=x"}}`,
			"metadata%5Bk+y%5D=v%26w%3Dx&metadata%5Border%5D=6735&name=a"},
		{"deepObject array of objects (Stripe items[0][price])", `{"name":"a","items":[{"price":"p1","quantity":2},{"price":"p2"}]}`,
			"items%5B0%5D%5Bprice%5D=p1&items%5B0%5D%5Bquantity%5D=2&items%5B1%5D%5Bprice%5D=p2&name=a"},
		{"deepObject nested objects", `{"name":"a","address":{"line1":"1 Main","geo":{"lat":1.5,"lng":-2}}}`,
			"address%5Bgeo%5D%5Blat%5D=1.5&address%5Bgeo%5D%5Blng%5D=-2&address%5Bline1%5D=1+Main&name=a"},
		{"no encoding: array repeats its key", `{"name":"a","tags":["x","y z"]}`, "name=a&tags=x&tags=y+z"},
		{"form without explode: comma-joined", `{"name":"a","ids":[1,2,3]}`, "ids=1,2,3&name=a"},
		{"form explode object: keys flattened", `{"name":"a","extra":{"color":"red"}}`, "color=red&name=a"},
		{"no encoding: object as JSON text", `{"name":"a","prefs":{"b":[1],"a":"x"}}`, "name=a&prefs=%7B%22a%22%3A%22x%22%2C%22b%22%3A%5B1%5D%7D"},
		{"contentType application/json: JSON text", `{"name":"a","prefs_json":{"k":true}}`, "name=a&prefs_json=%7B%22k%22%3Atrue%7D"},
		{"empty array sends nothing", `{"name":"a","expand":[],"tags":[]}`, "name=a"},
		{"values stay values", `{"name":"a&amount=1000"}`, "name=a%26amount%3D1000"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ct, body := send(t, c, tl, `{"body":`+tc.body+`}`)
			if ct != formType {
				t.Errorf("Content-Type = %q", ct)
			}
			if string(body) != tc.want {
				t.Errorf("body =\n  %s\nwant\n  %s", body, tc.want)
			}
		})
	}

	refusals := []struct {
		name, body, field string
	}{
		{"flattened key is a sibling's name", `{"name":"a","extra":{"amount":"1000"}}`, "body.extra.amount"},
		{"flattened key reads as a sibling's bracket", `{"name":"a","extra":{"metadata[x]":"y"}}`, "body.extra.metadata[x]"},
		{"bracket in a deepObject key", `{"name":"a","metadata":{"a][b":"x"}}`, "body.metadata.a][b"},
		{"empty deepObject key", `{"name":"a","metadata":{"":"x"}}`, "body.metadata."},
		{"null inside deepObject", `{"name":"a","metadata":{"k":null}}`, "body.metadata.k"},
		{"array of arrays without encoding", `{"name":"a","matrix":[["x"]]}`, "body.matrix[0]"},
		{"object in a comma-joined array", `{"name":"a","ids":[{"x":1}]}`, "body.ids[0]"},
		{"nested object in a flattened object", `{"name":"a","extra":{"k":{"x":"y"}}}`, "body.extra.k"},
		{"not an object", `"name=a"`, "body"},
	}
	for _, tc := range refusals {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			refused(t, c, tl, `{"body":`+tc.body+`}`, tc.field)
		})
	}
}

// TestQuerySerialisation: deepObject query parameters nest, allowReserved
// keeps reserved characters that do not change the query's structure, and
// an exploded object cannot pose as another parameter.
func TestQuerySerialisation(t *testing.T) {
	c, tl := serialTool(t, "search")
	base := "https://api.serial.example/v1/search?"
	cases := []struct {
		name, query, want string
	}{
		{"deepObject array", `{"filter":{"tags":["a","b"]}}`, "filter%5Btags%5D%5B%5D=a&filter%5Btags%5D%5B%5D=b"},
		{"deepObject nested object", `{"filter":{"owner":{"login":"octo cat"}}}`, "filter%5Bowner%5D%5Blogin%5D=octo+cat"},
		{"deepObject array of objects", `{"filter":{"rows":[{"x":"y"}]}}`, "filter%5Brows%5D%5B0%5D%5Bx%5D=y"},
		{"allowReserved keeps reserved", `{"q":"repo:a/b is:open@x!$'()*,[]?"}`, "q=repo:a/b%20is:open@x!$'()*,[]?"},
		{"allowReserved still escapes & = + # %", `{"q":"a&limit=1000#f+g%41"}`, "q=a%26limit%3D1000%23f%2Bg%2541"},
		{"allowReserved escapes ; (CVE-2021-23336 parameter cloaking)", `{"q":"a;limit=1000"}`, "q=a%3Blimit%3D1000"},
		{"no allowReserved escapes", `{"cursor":"a/b:c"}`, "cursor=a%2Fb%3Ac"},
		{"form explode object", `{"opts":{"zz":"1"},"limit":5}`, "limit=5&zz=1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, _ := send(t, c, tl, `{"query":`+tc.query+`}`)
			if got != base+tc.want {
				t.Errorf("url =\n  %s\nwant\n  %s", got, base+tc.want)
			}
		})
	}
	refusals := []struct {
		name, query, field string
	}{
		{"exploded key poses as limit", `{"opts":{"limit":"1000"},"limit":5}`, "query.opts.limit"},
		{"exploded key poses as filter[...]", `{"opts":{"filter[tags][]":"x"}}`, "query.opts.filter[tags][]"},
		{"bracket in a deepObject key", `{"filter":{"owner":{"a]":"x"}}}`, "query.filter.owner.a]"},
		{"null in deepObject", `{"filter":{"tags":[null]}}`, "query.filter.tags[0]"},
	}
	for _, tc := range refusals {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			refused(t, c, tl, `{"query":`+tc.query+`}`, tc.field)
		})
	}
}

// TestAllowReservedPath: a path parameter with allowReserved may span
// segments ("/") but never leave its place: no empty or dot segment, none
// hidden under percent-encoding, no "\", "?" or "#".
func TestAllowReservedPath(t *testing.T) {
	c, tl := serialTool(t, "get_content")
	cases := []struct {
		name, path, want string
	}{
		{"one file", "README.md", "/repos/o/r/contents/README.md"},
		{"nested file", "src/cmd/main.go", "/repos/o/r/contents/src/cmd/main.go"},
		{"escaped within segments", "docs/a b/é;x.md", "/repos/o/r/contents/docs/a%20b/%C3%A9%3Bx.md"},
		{"a literal percent stays literal", "a/100%.txt", "/repos/o/r/contents/a/100%25.txt"},
		{"dots inside a name", "a/.github/..x/...", "/repos/o/r/contents/a/.github/..x/..."},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, _, _ := send(t, c, tl, `{"path":{"owner":"o","repo":"r","path":"`+tc.path+`"}}`)
			if want := "https://api.serial.example" + tc.want; got != want {
				t.Errorf("url = %s, want %s", got, want)
			}
		})
	}
	refusals := []struct {
		name, path, cite string
	}{
		{"dot dot", "..", "RFC 3986 §5.2.4"},
		{"leading dot dot", "../secrets", "CWE-22"},
		{"inner dot dot", "a/../../b", "CWE-22"},
		{"dot", "a/./b", "RFC 3986 §5.2.4"},
		{"empty segment", "a//b", "segment confusion"},
		{"leading slash", "/etc/passwd", "absolute path"},
		{"trailing slash", "a/", "empty segment"},
		{"encoded dots", "a/%2e%2e/b", "CVE-2021-41773"},
		{"half encoded dots", "a/.%2E/b", "CVE-2021-41773"},
		{"double encoded dots", "a/%252e%252e/b", "CVE-2021-42013"},
		{"encoded slash", "a%2f..", "CVE-2021-41773"},
		{"backslash", `a\\..\\b`, "CVE-2019-0230-style backslash"},
		{"question mark", "a?admin=1", "query injection"},
		{"hash", "a#frag", "fragment injection"},
		{"control", `a\u0000b`, "NUL truncation"},
	}
	for _, tc := range refusals {
		t.Run("refused/"+tc.name+" ("+tc.cite+")", func(t *testing.T) {
			refused(t, c, tl, `{"path":{"owner":"o","repo":"r","path":"`+tc.path+`"}}`, "path.path")
		})
	}
	t.Run("refused/slash without allowReserved stays one segment", func(t *testing.T) {
		got, _, _ := send(t, c, tl, `{"path":{"owner":"a/b","repo":"r","path":"x"}}`)
		if want := "https://api.serial.example/repos/a%2Fb/r/contents/x"; got != want {
			t.Errorf("url = %s, want %s", got, want)
		}
	})
}

// part is one multipart part as Go's reader parses it.
type gotPart struct {
	name, filename, contentType string
	data                        []byte
}

func parseMultipart(t *testing.T, contentType string, body []byte) []gotPart {
	t.Helper()
	mt, params, err := mime.ParseMediaType(contentType)
	if err != nil || mt != multipartType || params["boundary"] == "" {
		t.Fatalf("Content-Type = %q (%v)", contentType, err)
	}
	r := multipart.NewReader(bytes.NewReader(body), params["boundary"])
	var out []gotPart
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("multipart: %v", err)
		}
		data, _ := io.ReadAll(p)
		out = append(out, gotPart{p.FormName(), p.FileName(), p.Header.Get("Content-Type"), data})
	}
}

// TestMultipart: a format: binary property is base64 in the args and a file
// part on the wire; names and filenames cannot break out of their header.
func TestMultipart(t *testing.T) {
	c, tl := serialTool(t, "upload_file")
	if tl.BodyType != multipartType {
		t.Fatalf("BodyType = %q", tl.BodyType)
	}
	if !bytes.Contains(tl.Schema, []byte(`"file_filename"`)) {
		t.Errorf("advertised schema lacks file_filename: %s", tl.Schema)
	}
	png := []byte("\x89PNG\r\n\x1a\n\x00binary\xff")
	b64 := base64.StdEncoding.EncodeToString(png)
	big := bytes.Repeat([]byte{0xA5}, 200<<10) // over the 64 KiB string cap once base64
	cases := []struct {
		name string
		body string
		want []gotPart
	}{
		{"file with filename, text and JSON parts", `{"file":"` + b64 + `","file_filename":"me.png","purpose":"avatar","meta":{"a":1}}`, []gotPart{
			{"file", "me.png", "image/png", png},
			{"meta", "", "application/json", []byte(`{"a":1}`)},
			{"purpose", "", "", []byte("avatar")},
		}},
		{"default filename is the property name", `{"file":"` + b64 + `","purpose":"document"}`, []gotPart{
			{"file", "file", "image/png", png},
			{"purpose", "", "", []byte("document")},
		}},
		{"array of files", `{"file":"","purpose":"avatar","attachments":["` + b64 + `","AA=="]}`, []gotPart{
			{"attachments", "attachments", octetType, png},
			{"attachments", "attachments", octetType, []byte{0}},
			{"file", "file", "image/png", []byte{}},
			{"purpose", "", "", []byte("avatar")},
		}},
		{"quote in filename is escaped", `{"file":"AA==","file_filename":"a\"; name=\"purpose.png","purpose":"avatar"}`, []gotPart{
			{"file", `a"; name="purpose.png`, "image/png", []byte{0}},
			{"purpose", "", "", []byte("avatar")},
		}},
		{"non-ASCII filename (RFC 2231)", `{"file":"AA==","file_filename":"été.png","purpose":"avatar"}`, []gotPart{
			{"file", "été.png", "image/png", []byte{0}},
			{"purpose", "", "", []byte("avatar")},
		}},
		{"large file", `{"file":"` + base64.StdEncoding.EncodeToString(big) + `","purpose":"avatar"}`, []gotPart{
			{"file", "file", "image/png", big},
			{"purpose", "", "", []byte("avatar")},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, ct, body := send(t, c, tl, `{"body":`+tc.body+`}`)
			got := parseMultipart(t, ct, body)
			if len(got) != len(tc.want) {
				t.Fatalf("got %d parts, want %d: %+v", len(got), len(tc.want), got)
			}
			for i, w := range tc.want {
				g := got[i]
				if g.name != w.name || g.filename != w.filename || g.contentType != w.contentType || !bytes.Equal(g.data, w.data) {
					t.Errorf("part %d = %q %q %q (%d bytes), want %q %q %q (%d bytes)", i, g.name, g.filename, g.contentType, len(g.data), w.name, w.filename, w.contentType, len(w.data))
				}
			}
		})
	}
	refusals := []struct {
		name, body, field string
	}{
		{"CR LF in filename (header injection)", `{"file":"AA==","file_filename":"a\r\nContent-Type: text/html","purpose":"avatar"}`, "body.file_filename"},
		{"path in filename", `{"file":"AA==","file_filename":"../../etc/passwd","purpose":"avatar"}`, "body.file_filename"},
		{"backslash in filename", `{"file":"AA==","file_filename":"..\\x","purpose":"avatar"}`, "body.file_filename"},
		{"dot dot filename", `{"file":"AA==","file_filename":"..","purpose":"avatar"}`, "body.file_filename"},
		{"not base64", `{"file":"not base64!","purpose":"avatar"}`, "body.file"},
		{"unpadded base64", `{"file":"AA","purpose":"avatar"}`, "body.file"},
		{"url-safe base64", `{"file":"_-8=","purpose":"avatar"}`, "body.file"},
		{"file not a string", `{"file":{"a":1},"purpose":"avatar"}`, "body.file"},
		{"file array item", `{"file":"AA==","purpose":"avatar","attachments":["AA==","%%"]}`, "body.attachments[1]"},
		{"oversized text part", `{"file":"AA==","purpose":"` + strings.Repeat("a", 64<<10+1) + `"}`, "body.purpose"},
	}
	for _, tc := range refusals {
		t.Run("refused/"+tc.name, func(t *testing.T) {
			refused(t, c, tl, `{"body":`+tc.body+`}`, tc.field)
		})
	}
	t.Run("refused/files over MaxArgsBytes in total", func(t *testing.T) {
		half := base64.StdEncoding.EncodeToString(make([]byte, MaxArgsBytes/2+1))
		a := Args{Body: map[string]any{"file": half, "purpose": "avatar", "attachments": []any{half}}}
		var ae *ArgError
		if _, err := tl.NewRequest(context.Background(), c.BaseURL, a); !errors.As(err, &ae) || !strings.Contains(ae.Reason, "in total") {
			t.Errorf("NewRequest = %v, want the total size refused", err)
		}
	})
	t.Run("refused/unknown property", func(t *testing.T) {
		a := decode(t, `{"body":{"file":"AA==","purpose":"avatar","other":"x"}}`)
		if err := tl.Validate(a); err == nil {
			t.Error("Validate accepted a property additionalProperties: false refuses")
		}
	})
}

// TestBinaryBody: a whole-body binary is a base64 string, sent decoded; the
// media types are picked JSON, form, multipart, then binary.
func TestBinaryBody(t *testing.T) {
	c, tl := serialTool(t, "put_blob")
	if tl.BodyType != octetType {
		t.Fatalf("BodyType = %q, want %q (preferred over text/plain)", tl.BodyType, octetType)
	}
	url, ct, body := send(t, c, tl, `{"path":{"name":"x"},"body":"AAEC/w=="}`)
	if url != "https://api.serial.example/v1/blobs/x" || ct != octetType || !bytes.Equal(body, []byte{0, 1, 2, 0xff}) {
		t.Errorf("got %s %q %x", url, ct, body)
	}
	refused(t, c, tl, `{"path":{"name":"x"},"body":"AAEC/w"}`, "body")
	refused(t, c, tl, `{"path":{"name":"x"},"body":{"a":1}}`, "body")

	_, av := serialTool(t, "put_avatar")
	if av.BodyType != "image/*" {
		t.Errorf("put_avatar BodyType = %q", av.BodyType)
	}
	if _, ct, body := send(t, c, av, `{"body":"iVBO"}`); ct != octetType || !bytes.Equal(body, []byte{0x89, 0x50, 0x4e}) {
		t.Errorf("put_avatar sent %q %x: a wildcard type goes as %s", ct, body, octetType)
	}
	_, any := serialTool(t, "post_anything")
	if any.BodyType != multipartType {
		t.Errorf("post_anything BodyType = %q, want multipart before */*", any.BodyType)
	}
}

// FuzzSerial: whatever Validate accepts, NewRequest sends (the encoder
// refuses nothing the validator let through), an allowReserved path never
// leaves contents/ nor holds a dot segment however often it is decoded, and
// a form body parses back.
func FuzzSerial(f *testing.F) {
	f.Add("get_content", `{"path":{"owner":"o","repo":"r","path":"a/b.go"}}`)                  // allowReserved, two segments
	f.Add("get_content", `{"path":{"owner":"o","repo":"r","path":"a/%2e%2e/b"}}`)              // encoded dot segment
	f.Add("create_customer", `{"body":{"name":"a","items":[{"price":"p"}]}}`)                  // deepObject array of objects
	f.Add("create_customer", `{"body":{"name":"a","extra":{"amount":"1"}}}`)                   // collision
	f.Add("search", `{"query":{"filter":{"rows":[{"x":"y"}]},"q":"a&b"}}`)                     // deepObject, allowReserved
	f.Add("upload_file", `{"body":{"file":"AA==","file_filename":"x\"y","purpose":"avatar"}}`) // quoted filename
	c := mustLoad(f, "serial", "testdata/serial-3.0.yaml")
	f.Fuzz(func(t *testing.T, name, data string) {
		var tl *Tool
		for _, x := range c.Tools {
			if x.Name == "serial."+name {
				tl = x
			}
		}
		if tl == nil {
			return
		}
		args, err := DecodeArgs([]byte(data))
		if err != nil || tl.Validate(args) != nil {
			return
		}
		req, err := tl.NewRequest(context.Background(), c.BaseURL, args)
		if err != nil {
			t.Fatalf("Validate accepted %s but NewRequest refused it: %v", data, err)
		}
		if name == "get_content" {
			rest, ok := strings.CutPrefix(req.URL.EscapedPath(), "/repos/")
			if !ok {
				t.Fatalf("path %q left /repos/", req.URL.EscapedPath())
			}
			for _, seg := range strings.Split(rest, "/") {
				for i := 0; i < 5; i++ {
					if seg == "" || isDotSegment(seg) {
						t.Fatalf("path %q holds an empty or dot segment %q", req.URL.EscapedPath(), seg)
					}
					if seg, err = url.PathUnescape(seg); err != nil {
						break
					}
				}
			}
		}
		if name == "create_customer" {
			b, _ := io.ReadAll(req.Body)
			if _, err := url.ParseQuery(string(b)); err != nil {
				t.Fatalf("form body %q does not parse: %v", b, err)
			}
		}
	})
}

// TestBodySkips: a body this package cannot send faithfully skips its
// operation with the reason and leaves the rest of the connector loaded.
func TestBodySkips(t *testing.T) {
	spec := `openapi: 3.0.3
info: {title: t, version: "1"}
servers: [{url: "https://api.example.com"}]
paths:
  /ok:
    get:
      parameters: [{name: X-Trace, in: header, allowReserved: true, schema: {type: string}}]
      responses: {"200": {description: ok}}
  /parts:
    post:
      requestBody:
        content:
          multipart/form-data:
            schema: {type: object, properties: {"a\"b": {type: string}}}
      responses: {"200": {description: ok}}
  /text:
    post:
      requestBody:
        content:
          text/plain: {schema: {type: string}}
      responses: {"200": {description: ok}}
`
	c, err := LoadData(context.Background(), "s", []byte(spec), "")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	if len(c.Tools) != 1 || c.Tools[0].Name != "s.get_ok" {
		t.Errorf("tools = %d, want s.get_ok alone (allowReserved on a header is ignored)", len(c.Tools))
	}
	want := []Problem{
		{"POST /parts", "#/paths/~1parts/post/requestBody", `request body: property "a\"b": not a safe multipart part name`},
		{"POST /text", "#/paths/~1text/post/requestBody", `request body has no JSON, form, multipart or binary media type`},
	}
	if !reflect.DeepEqual(c.Skipped, want) {
		t.Errorf("skipped =\n  %q\nwant\n  %q", c.Skipped, want)
	}
}

// BenchmarkSerial measures Validate plus NewRequest for a Stripe-style form
// body and for a multipart upload of 512 KiB.
func BenchmarkSerial(b *testing.B) {
	c := mustLoad(b, "serial", "testdata/serial-3.0.yaml")
	file := base64.StdEncoding.EncodeToString(make([]byte, 512<<10))
	for _, bc := range []struct{ name, tool, args string }{
		{"form_deepObject", "serial.create_customer", `{"body":{"name":"a","expand":["x","y"],"metadata":{"a":"1","b":"2"},"items":[{"price":"p1","quantity":2},{"price":"p2"}],"address":{"line1":"l","geo":{"lat":1}}}}`},
		{"multipart_512KiB", "serial.upload_file", `{"body":{"file":"` + file + `","purpose":"avatar"}}`},
	} {
		tl := tool(b, c, bc.tool)
		b.Run(bc.name, func(b *testing.B) {
			for i := 0; i < b.N; i++ {
				args, err := DecodeArgs([]byte(bc.args))
				if err == nil {
					err = tl.Validate(args)
				}
				if err == nil {
					_, err = tl.NewRequest(context.Background(), c.BaseURL, args)
				}
				if err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestMultipart31: OpenAPI 3.1 files as vendors write them: Discord's
// contentEncoding: binary and a contentMediaType are file parts; a
// contentEncoding: base64 property is sent as the base64 text it is.
func TestMultipart31(t *testing.T) {
	spec := `openapi: 3.1.0
info: {title: t, version: "1"}
servers: [{url: "https://api.example.com"}]
paths:
  /stickers:
    post:
      operationId: createSticker
      requestBody:
        content:
          multipart/form-data:
            schema:
              type: object
              properties:
                file: {type: string, contentEncoding: binary}
                pic: {type: string, contentMediaType: image/png}
                b64: {type: string, contentEncoding: base64}
      responses: {"200": {description: ok}}
`
	c, err := LoadData(context.Background(), "d", []byte(spec), "")
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	tl := tool(t, c, "d.create_sticker")
	_, ct, body := send(t, c, tl, `{"body":{"file":"AAE=","pic":"Ag==","b64":"AAE="}}`)
	got := parseMultipart(t, ct, body)
	want := []gotPart{
		{"b64", "", "", []byte("AAE=")},
		{"file", "file", octetType, []byte{0, 1}},
		{"pic", "pic", "image/png", []byte{2}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("parts = %q, want %q", got, want)
	}
}

// TestMultipartExactBytes: the multipart body is a function of the
// arguments (the boundary is their hash), so a held call's re-send and an
// "always allow" grant match on the request hash; the bytes are as below.
func TestMultipartExactBytes(t *testing.T) {
	c, tl := serialTool(t, "upload_file")
	args := `{"body":{"file":"AAE=","file_filename":"a.png","purpose":"avatar"}}`
	_, ct1, b1 := send(t, c, tl, args)
	_, ct2, b2 := send(t, c, tl, args)
	if ct1 != ct2 || !bytes.Equal(b1, b2) {
		t.Fatalf("the same arguments built two bodies:\n%q\n%q", b1, b2)
	}
	_, boundary, _ := strings.Cut(ct1, "boundary=")
	want := "--" + boundary + "\r\n" +
		"Content-Disposition: form-data; filename=a.png; name=file\r\n" +
		"Content-Type: image/png\r\n\r\n" +
		"\x00\x01\r\n" +
		"--" + boundary + "\r\n" +
		"Content-Disposition: form-data; name=purpose\r\n\r\n" +
		"avatar\r\n" +
		"--" + boundary + "--\r\n"
	if string(b1) != want || !strings.HasPrefix(boundary, "sluice") || len(boundary) > 70 {
		t.Errorf("body =\n%q\nwant\n%q", b1, want)
	}
	if _, _, b3 := send(t, c, tl, `{"body":{"file":"AAI=","file_filename":"a.png","purpose":"avatar"}}`); bytes.Contains(b3, []byte(boundary)) {
		t.Errorf("other arguments reused the boundary %s", boundary)
	}
}
