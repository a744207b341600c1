package creds

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/vault"
)

// testSchemes are the securitySchemes the credential tests draw from.
var testSchemes = map[string]*connectors.SecurityScheme{
	"hdr":    {Name: "hdr", Type: "apiKey", In: "header", Param: "X-Api-Key"},
	"qry":    {Name: "qry", Type: "apiKey", In: "query", Param: "api_key"},
	"cookie": {Name: "cookie", Type: "apiKey", In: "cookie", Param: "sid"},
	"bearer": {Name: "bearer", Type: "http", Scheme: "bearer"},
	"admin":  {Name: "admin", Type: "http", Scheme: "bearer"},
	"basic":  {Name: "basic", Type: "http", Scheme: "basic"},
	"oauth":  {Name: "oauth", Type: "oauth2"},
	"oidc":   {Name: "oidc", Type: "openIdConnect"},
	"authz":  {Name: "authz", Type: "apiKey", In: "header", Param: "authorization"},
}

// testConnector is connector t with one tool per security list (t.op0,
// t.op1, …).
func testConnector(security ...[][]string) *connectors.Connector {
	c := &connectors.Connector{Slug: "t", Schemes: testSchemes}
	for i, sec := range security {
		c.Tools = append(c.Tools, &connectors.Tool{Name: fmt.Sprintf("t.op%d", i), Connector: "t", Security: sec})
	}
	return c
}

func TestAttach(t *testing.T) {
	const secret = "s3cret-value-1234"
	basicAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("AC123:"+secret))
	cases := []struct {
		name     string
		cred     config.Credential
		security [][]string
		value    string
		check    func(*http.Request) bool
		where    string
	}{
		{"apiKey header", config.Credential{Secret: "k"}, [][]string{{"hdr"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("X-Api-Key") == secret }, "header:X-Api-Key"},
		{"apiKey query replaces the agent's value", config.Credential{Secret: "k"}, [][]string{{"qry"}}, secret,
			func(r *http.Request) bool {
				return r.URL.Query()["api_key"][0] == secret && len(r.URL.Query()["api_key"]) == 1
			}, "query:api_key"},
		{"apiKey cookie replaces the agent's cookie", config.Credential{Secret: "k"}, [][]string{{"cookie"}}, secret,
			func(r *http.Request) bool {
				c, err := r.Cookie("sid")
				return err == nil && c.Value == secret && strings.Count(r.Header.Get("Cookie"), "sid=") == 1
			}, "cookie:sid"},
		{"bearer", config.Credential{Secret: "k"}, [][]string{{"bearer"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+secret }, "bearer"},
		{"basic from user:password", config.Credential{Secret: "k"}, [][]string{{"basic"}}, "AC123:" + secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == basicAuth }, "basic"},
		{"the satisfiable alternative", config.Credential{Secret: "k"}, [][]string{{"oauth"}, {"hdr", "oauth"}, {"bearer"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+secret }, "bearer"},
		{"AND: both schemes carry it", config.Credential{Secret: "k"}, [][]string{{"hdr", "qry"}}, secret,
			func(r *http.Request) bool {
				return r.Header.Get("X-Api-Key") == secret && r.URL.Query().Get("api_key") == secret
			},
			"header:X-Api-Key,query:api_key"},
		{"scheme named in config", config.Credential{Secret: "k", Scheme: "qry"}, [][]string{{"hdr"}}, secret,
			func(r *http.Request) bool {
				return r.URL.Query().Get("api_key") == secret && r.Header.Get("X-Api-Key") == ""
			}, "query:api_key"},
		{"explicit header with prefix", config.Credential{Secret: "k", Header: "Authorization", Prefix: "Token "}, [][]string{{"hdr"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "Token "+secret }, "header:Authorization"},
		{"explicit query", config.Credential{Secret: "k", Query: "key"}, [][]string{{"oauth"}}, secret,
			func(r *http.Request) bool { return r.URL.Query().Get("key") == secret }, "query:key"},
		{"security: [] is sent without it", config.Credential{Secret: "k"}, [][]string{}, secret,
			func(r *http.Request) bool {
				return r.Header.Get("X-Api-Key") == "" && r.Header.Get("Authorization") == "" && r.URL.Query().Get("api_key") == "agent-supplied"
			}, ""},
		{"security: [] even with credential.header", config.Credential{Secret: "k", Header: "X-Api-Key"}, [][]string{}, secret,
			func(r *http.Request) bool { return r.Header.Get("X-Api-Key") == "" }, ""},
		{"optional {} with a fitting alternative", config.Credential{Secret: "k"}, [][]string{{}, {"hdr"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("X-Api-Key") == secret }, "header:X-Api-Key"},
		{"optional {} and nothing fits", config.Credential{Secret: "k"}, [][]string{{}, {"oauth"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "" }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			// A sibling operation that requires the credential makes the
			// spec one that declares security.
			plan, errs, _ := NewPlan("connectors[0]", config.Connector{Slug: "t", Credential: &tc.cred}, testConnector(tc.security, [][]string{{"hdr"}}), shapeUnknown)
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			u, _ := url.Parse("https://api.example.test/v1/x?api_key=agent-supplied")
			req := &http.Request{Method: "GET", URL: u, Header: http.Header{"Cookie": {"sid=agent-supplied; other=1"}}}
			att, err := Attach(req, plan, &connectors.Tool{Name: "t.op0", Security: tc.security}, vault.NewSecret([]byte(tc.value)))
			if err != nil {
				t.Fatal(err)
			}
			if att.Where != tc.where || !tc.check(req) {
				t.Fatalf("attached at %q (want %q); request %v %v", att.Where, tc.where, req.URL, req.Header)
			}
		})
	}
}

// TestPickScheme is the choice among an operation's security alternatives
// (OpenAPI 3.0.3 §4.8.10: any one alternative, every scheme of it) by the
// credential's shape and the config, made by NewPlan for validate and
// serve and by attach per call.
func TestPickScheme(t *testing.T) {
	const token, pair = "tok-0123456789abcdef", "AC0123456789:authtoken-abcdef"
	cases := []struct {
		name     string
		cred     config.Credential
		shape    Shape // before the call (config, stored value)
		security [][]string
		value    string // at the call
		where    string // attach's result
		planErr  []string
		callErr  error
	}{
		{"basic first (Twilio-like), a bearer token", config.Credential{Secret: "k"}, shapeToken, [][]string{{"basic"}, {"bearer"}}, token, "bearer", nil, nil},
		{"basic first, value unknown before the call: the token decides", config.Credential{Secret: "k"}, shapeUnknown, [][]string{{"basic"}, {"bearer"}}, token, "bearer", nil, nil},
		{"bearer first, user:password", config.Credential{Secret: "k"}, shapePair, [][]string{{"bearer"}, {"basic"}}, pair, "basic", nil, nil},
		{"bearer first, unknown before the call: user:password decides", config.Credential{Secret: "k"}, shapeUnknown, [][]string{{"bearer"}, {"basic"}}, pair, "basic", nil, nil},
		{"Vault dynamic username and password is basic", config.Credential{Vault: &config.VaultRef{Dynamic: "database/creds/ro"}}, shapePair, [][]string{{"bearer"}, {"hdr"}, {"basic"}}, pair, "basic", nil, nil},
		{"a ':' in an API key where no basic is offered", config.Credential{Secret: "k"}, shapePair, [][]string{{"hdr"}}, pair, "header:X-Api-Key", nil, nil},
		{"two bearer schemes send the same bytes: no choice", config.Credential{Secret: "k"}, shapeToken, [][]string{{"bearer"}, {"admin"}}, token, "bearer", nil, nil},
		{"AND needs each: oauth2 half never fits", config.Credential{Secret: "k"}, shapeToken, [][]string{{"bearer", "oauth"}, {"qry"}}, token, "query:api_key", nil, nil},
		{"AND of two schemes in one header never fits", config.Credential{Secret: "k"}, shapeToken, [][]string{{"authz", "bearer"}, {"hdr"}}, token, "header:X-Api-Key", nil, nil},
		{"explicit scheme wins over the fitting one", config.Credential{Secret: "k", Scheme: "bearer"}, shapePair, [][]string{{"basic"}, {"bearer"}}, pair, "bearer", nil, nil},
		{"ambiguous: header or query", config.Credential{Secret: "k"}, shapeToken, [][]string{{"hdr"}, {"qry"}}, token, "",
			[]string{"connectors[0].credential: the credential, a token (it has no ':', so it cannot be user:password), fits more than one security alternative of t.op0: hdr (apiKey in header X-Api-Key) or qry (apiKey in query api_key); set credential.scheme"}, errAmbiguous},
		{"ambiguous: bearer or apiKey Authorization", config.Credential{Secret: "k"}, shapeUnknown, [][]string{{"bearer"}, {"authz"}}, token, "",
			[]string{"t.op0: bearer (http bearer) or authz (apiKey in header authorization)"}, errAmbiguous},
		{"oauth2 and openIdConnect only", config.Credential{Secret: "k"}, shapeToken, [][]string{{"oauth"}, {"oidc"}}, token, "",
			[]string{`fits no operation of the spec: t.op0 ("oauth" is an oauth2 scheme, which sluice cannot attach (it runs no OAuth flow); "oidc" is an openIdConnect scheme`}, errNoScheme},
		{"basic only, a token", config.Credential{Vault: &config.VaultRef{TransitKey: "k", Audience: "a"}}, shapeToken, [][]string{{"basic"}}, token, "",
			[]string{`"basic" is http basic and the credential is a token`}, errNoScheme},
		{"named scheme is oauth2", config.Credential{Secret: "k", Scheme: "oauth"}, shapeToken, [][]string{{"oauth"}}, token, "",
			[]string{`connectors[0].credential.scheme: "oauth" is an oauth2 scheme, which sluice cannot attach`, "use credential.header or credential.query instead"}, nil},
		{"named scheme unknown", config.Credential{Secret: "k", Scheme: "nope"}, shapeToken, [][]string{{"hdr"}}, token, "",
			[]string{`connectors[0].credential.scheme: the spec has no securityScheme "nope"; the spec's securitySchemes: admin (http bearer), authz (apiKey in header authorization), basic (http basic)`}, nil},
		{"named basic for a Vault JWT", config.Credential{Vault: &config.VaultRef{OIDCRole: "r"}, Scheme: "basic"}, shapeToken, [][]string{{"basic"}}, token, "",
			[]string{`connectors[0].credential.scheme: "basic" is http basic and the credential is a token`}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			conn := testConnector(tc.security)
			plan, errs, _ := NewPlan("connectors[0]", config.Connector{Slug: "t", Credential: &tc.cred}, conn, tc.shape)
			got := fmt.Sprint(errs)
			for _, w := range tc.planErr {
				if !strings.Contains(got, w) {
					t.Errorf("plan errors %q\n do not say %q", got, w)
				}
			}
			if len(tc.planErr) == 0 && len(errs) > 0 {
				t.Fatalf("plan errors: %v", errs)
			}
			if len(tc.planErr) > 0 {
				if plan != nil {
					t.Fatal("a plan was made despite errors: serve would start")
				}
				if tc.callErr == nil {
					return
				}
				// The call decides the same way when the plan is bypassed.
				plan = &Plan{schemes: testSchemes, shape: tc.shape, declared: true}
			}
			u, _ := url.Parse("https://api.example.test/x")
			req := &http.Request{Method: "GET", URL: u, Header: http.Header{}}
			att, err := Attach(req, plan, conn.Tools[0], vault.NewSecret([]byte(tc.value)))
			if tc.callErr != nil {
				if !errors.Is(err, tc.callErr) || len(req.Header) != 0 || req.URL.RawQuery != "" {
					t.Fatalf("attach = %v (request %v %v), want %v and nothing attached", err, req.URL, req.Header, tc.callErr)
				}
				return
			}
			if err != nil || att.Where != tc.where {
				t.Fatalf("attach = %q, %v; want %q", att.Where, err, tc.where)
			}
		})
	}
}

// TestCredPlanNowhere: a credential on a spec none of whose operations
// declares security goes nowhere unless the config says where; it is an
// error naming the keys that fix it, never a call sent without it.
func TestCredPlanNowhere(t *testing.T) {
	conn := &connectors.Connector{Slug: "t", Tools: []*connectors.Tool{{Name: "t.list", Security: [][]string{}}}}
	_, errs, _ := NewPlan("connectors[2]", config.Connector{Slug: "t", Credential: &config.Credential{Secret: "k"}}, conn, shapeToken)
	want := "connectors[2].credential: no operation of the spec declares a security requirement, so the credential would go nowhere; set credential.header or credential.query (with prefix), or credential.scheme (the spec defines no securitySchemes)"
	if len(errs) != 1 || errs[0].Error() != want {
		t.Fatalf("errs = %v\nwant %s", errs, want)
	}
	// What serve would do per call without the plan's refusal: refuse too.
	u, _ := url.Parse("https://api.example.test/x")
	req := &http.Request{URL: u, Header: http.Header{}}
	if _, err := Attach(req, &Plan{}, conn.Tools[0], vault.NewSecret([]byte("tok-0123456789"))); !errors.Is(err, errNowhere) {
		t.Fatalf("attach = %v, want errNowhere", err)
	}
	for _, cr := range []config.Credential{{Secret: "k", Header: "X-Key"}, {Secret: "k", Query: "key"}} {
		plan, errs, _ := NewPlan("connectors[2]", config.Connector{Slug: "t", Credential: &cr}, conn, shapeToken)
		req := &http.Request{URL: u, Header: http.Header{}}
		if att, err := Attach(req, plan, conn.Tools[0], vault.NewSecret([]byte("tok-0123456789"))); len(errs) > 0 || err != nil || att.Where == "" {
			t.Fatalf("%+v: errs %v, attach %q %v", cr, errs, att.Where, err)
		}
	}
}

// TestCredPlanWarnings: some operations unfit or needing several schemes
// are warnings naming them; the plan is made.
func TestCredPlanWarnings(t *testing.T) {
	conn := testConnector([][]string{{"hdr"}}, [][]string{{"oauth"}}, [][]string{{"hdr", "qry"}})
	plan, errs, warns := NewPlan("connectors[0]", config.Connector{Slug: "t", Credential: &config.Credential{Secret: "k"}}, conn, shapeToken)
	if plan == nil || len(errs) > 0 {
		t.Fatalf("plan %v, errs %v", plan, errs)
	}
	got := fmt.Sprint(warns)
	for _, w := range []string{
		`connectors[0].credential: 1 operation cannot carry the credential, a token (it has no ':', so it cannot be user:password), and will be refused 503 credential_unavailable: t.op1 ("oauth" is an oauth2 scheme`,
		"connectors[0].credential: 1 operation require several schemes at once; the one credential is sent as each: t.op2 (hdr (apiKey in header X-Api-Key) + qry (apiKey in query api_key))",
	} {
		if !strings.Contains(got, w) {
			t.Errorf("warnings %q\n do not say %q", got, w)
		}
	}
}

func TestAttachRefusesBadCredentials(t *testing.T) {
	for name, tc := range map[string]struct {
		scheme, value, want string
	}{
		"CRLF would split headers (D6)": {"hdr", "abc\r\nX-Evil: 1", "CR, LF or NUL"},
		"basic without a colon":         {"basic", "justapassword", "user:password"},
	} {
		t.Run(name, func(t *testing.T) {
			u, _ := url.Parse("https://api.example.test/")
			req := &http.Request{URL: u, Header: http.Header{}}
			plan := &Plan{schemes: testSchemes, declared: true}
			_, err := Attach(req, plan, &connectors.Tool{Security: [][]string{{tc.scheme}}}, vault.NewSecret([]byte(tc.value)))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to say %q", err, tc.want)
			}
			if strings.Contains(err.Error(), tc.value) {
				t.Fatal("the error contains the credential")
			}
			if len(req.Header) != 0 {
				t.Fatalf("a refused credential was attached: %v", req.Header)
			}
		})
	}
}

// BenchmarkAttach is the per-call cost of deciding and attaching: an
// operation with three alternatives (oauth2, basic, bearer) and a token.
func BenchmarkAttach(b *testing.B) {
	plan := &Plan{schemes: testSchemes, declared: true}
	tool := &connectors.Tool{Name: "t.op0", Security: [][]string{{"oauth"}, {"basic"}, {"bearer"}}}
	sec := vault.NewSecret([]byte("tok-0123456789abcdef"))
	u, _ := url.Parse("https://api.example.test/x")
	b.ReportAllocs()
	for b.Loop() {
		req := &http.Request{URL: u, Header: http.Header{}}
		if _, err := Attach(req, plan, tool, sec); err != nil {
			b.Fatal(err)
		}
	}
}
