package gateway

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/vault"
)

func TestAttach(t *testing.T) {
	schemes := map[string]*connectors.SecurityScheme{
		"hdr":    {Name: "hdr", Type: "apiKey", In: "header", Param: "X-Api-Key"},
		"qry":    {Name: "qry", Type: "apiKey", In: "query", Param: "api_key"},
		"cookie": {Name: "cookie", Type: "apiKey", In: "cookie", Param: "sid"},
		"bearer": {Name: "bearer", Type: "http", Scheme: "bearer"},
		"basic":  {Name: "basic", Type: "http", Scheme: "basic"},
		"oauth":  {Name: "oauth", Type: "oauth2"},
	}
	const secret = "s3cret-value-1234"
	basicAuth := "Basic " + base64.StdEncoding.EncodeToString([]byte("AC123:"+secret))
	cases := []struct {
		name     string
		cred     config.Credential
		security [][]string
		value    string
		check    func(*http.Request) bool
		where    string
		err      error
	}{
		{"apiKey header", config.Credential{Secret: "k"}, [][]string{{"hdr"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("X-Api-Key") == secret }, "header:X-Api-Key", nil},
		{"apiKey query replaces the agent's value", config.Credential{Secret: "k"}, [][]string{{"qry"}}, secret,
			func(r *http.Request) bool {
				return r.URL.Query()["api_key"][0] == secret && len(r.URL.Query()["api_key"]) == 1
			}, "query:api_key", nil},
		{"apiKey cookie replaces the agent's cookie", config.Credential{Secret: "k"}, [][]string{{"cookie"}}, secret,
			func(r *http.Request) bool {
				c, err := r.Cookie("sid")
				return err == nil && c.Value == secret && strings.Count(r.Header.Get("Cookie"), "sid=") == 1
			}, "cookie:sid", nil},
		{"bearer", config.Credential{Secret: "k"}, [][]string{{"bearer"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+secret }, "bearer", nil},
		{"basic from user:password", config.Credential{Secret: "k"}, [][]string{{"basic"}}, "AC123:" + secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == basicAuth }, "basic", nil},
		{"first satisfiable alternative", config.Credential{Secret: "k"}, [][]string{{"oauth"}, {"hdr", "qry"}, {"bearer"}}, secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "Bearer "+secret }, "bearer", nil},
		{"scheme named in config", config.Credential{Secret: "k", Scheme: "qry"}, [][]string{{"hdr"}}, secret,
			func(r *http.Request) bool {
				return r.URL.Query().Get("api_key") == secret && r.Header.Get("X-Api-Key") == ""
			}, "query:api_key", nil},
		{"explicit header with prefix", config.Credential{Secret: "k", Header: "Authorization", Prefix: "Token "}, nil, secret,
			func(r *http.Request) bool { return r.Header.Get("Authorization") == "Token "+secret }, "header:Authorization", nil},
		{"explicit query", config.Credential{Secret: "k", Query: "key"}, nil, secret,
			func(r *http.Request) bool { return r.URL.Query().Get("key") == secret }, "query:key", nil},
		{"operation needs none", config.Credential{Secret: "k"}, nil, secret,
			func(r *http.Request) bool {
				return r.Header.Get("X-Api-Key") == "" && r.Header.Get("Authorization") == ""
			}, "", nil},
		{"only unsupported schemes", config.Credential{Secret: "k"}, [][]string{{"oauth"}}, secret, nil, "", errNoScheme},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u, _ := url.Parse("https://api.example.test/v1/x?api_key=agent-supplied")
			req := &http.Request{Method: "GET", URL: u, Header: http.Header{"Cookie": {"sid=agent-supplied; other=1"}}}
			att, err := attach(req, &tc.cred, &connectors.Tool{Name: "t.x", Security: tc.security}, schemes, vault.NewSecret([]byte(tc.value)))
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err = %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if att.where != tc.where || !tc.check(req) {
				t.Fatalf("attached at %q (want %q); request %v %v", att.where, tc.where, req.URL, req.Header)
			}
		})
	}
}

func TestAttachRefusesBadCredentials(t *testing.T) {
	schemes := map[string]*connectors.SecurityScheme{"basic": {Type: "http", Scheme: "basic"}, "hdr": {Type: "apiKey", In: "header", Param: "X-K"}}
	for name, tc := range map[string]struct {
		scheme, value, want string
	}{
		"CRLF would split headers (D6)": {"hdr", "abc\r\nX-Evil: 1", "CR, LF or NUL"},
		"basic without a colon":         {"basic", "justapassword", "user:password"},
	} {
		t.Run(name, func(t *testing.T) {
			u, _ := url.Parse("https://api.example.test/")
			req := &http.Request{URL: u, Header: http.Header{}}
			_, err := attach(req, &config.Credential{Secret: "k"}, &connectors.Tool{Security: [][]string{{tc.scheme}}}, schemes, vault.NewSecret([]byte(tc.value)))
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

// TestUpstreamScrubber checks the per-upstream scrubber cache: the same
// credential reuses its scrubber, a changed one (rotated, or a basic-auth
// password added) gets a new scrubber that finds the new secret.
func TestUpstreamScrubber(t *testing.T) {
	const first, rotated = "sk-first-0123456789", "sk-rotated-9876543210"
	cases := []struct {
		name      string
		prev, now [][]byte
		reuse     bool
		find      string // a secret the scrubber in use must find
	}{
		{"same credential", [][]byte{[]byte(first)}, [][]byte{[]byte(first)}, true, first},
		{"rotated", [][]byte{[]byte(first)}, [][]byte{[]byte(rotated)}, false, rotated},
		{"same length, one byte differs", [][]byte{[]byte(first)}, [][]byte{[]byte(first[:len(first)-1] + "X")}, false, first[:len(first)-1] + "X"},
		{"password form added", [][]byte{[]byte("user:pass-0123456")}, [][]byte{[]byte("user:pass-0123456"), []byte("pass-0123456")}, false, "pass-0123456"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			u := &upstream{}
			a := u.scrubber(tc.prev)
			b := u.scrubber(tc.now)
			if (a == b) != tc.reuse {
				t.Fatalf("scrubber reused = %v, want %v", a == b, tc.reuse)
			}
			out, found := b.String("reply " + tc.find + " end")
			if !found || strings.Contains(out, tc.find) {
				t.Fatalf("scrubber in use did not scrub %q: %q", tc.find, out)
			}
		})
	}
	t.Run("cached forms are copies", func(t *testing.T) {
		u := &upstream{}
		sec := []byte(first)
		a := u.scrubber([][]byte{sec})
		copy(sec, rotated) // the caller's buffer is reused for another secret
		if b := u.scrubber([][]byte{[]byte(first)}); a != b {
			t.Fatal("the cache followed a change to the caller's buffer")
		}
	})
}
