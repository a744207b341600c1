package oauthtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"github.com/zitadel/oidc/v3/example/server/exampleop"
	"github.com/zitadel/oidc/v3/example/server/storage"
)

// MCPAuth is a remote MCP server that speaks MCP authorization, with its
// authorization server, for tests:
//
//   - the authorization server is zitadel/oidc's op (as Start's), fronted
//     with RFC 8414 metadata (its OpenID configuration plus a
//     registration_endpoint) and an RFC 7591 registration endpoint, which
//     op does not implement: each registration hands out the next of
//     RegistrationPool web clients made in op's storage at start (secret
//     WebSecret, the redirect given to StartMCP);
//   - the MCP server is the Go SDK's streamable HTTP server behind the
//     SDK's RequireBearerToken, which answers 401 with
//     WWW-Authenticate: Bearer resource_metadata=… and checks each token
//     at op's userinfo endpoint; its RFC 9728 metadata is served by the
//     SDK's ProtectedResourceMetadataHandler. Its tool "whoami" answers the
//     token's subject.
//
// Resource and Issuer, when set, make the metadata lie (a document naming
// another resource, an issuer that is not the one asked for).
type MCPAuth struct {
	AS     *Server
	MCPURL string // the MCP endpoint: http://127.0.0.1:PORT/mcp
	// Registrations counts requests to the registration endpoint.
	Registrations atomic.Int64
	// NoChallenge, set, drops the WWW-Authenticate header from the MCP
	// server's 401s: a client must find the metadata at the well-known URL.
	NoChallenge atomic.Bool

	mu         sync.Mutex
	resource   string   // PRM's resource ("" = MCPURL)
	issuer     string   // the 8414 document's issuer ("" = the real one)
	tokenRes   []string // resource= of each token request
	authRes    []string // resource= of each authorization request
	seen       []string // bearer tokens the MCP server received (valid or not)
	nextClient int
	revoked    map[string]bool // client ids whose registration the server ended
}

// RevokeClient ends the registration of client id: the token endpoint
// answers its requests 401 invalid_client (RFC 6749 5.2), as a server
// that expired or deleted a dynamically registered client does.
func (m *MCPAuth) RevokeClient(id string) {
	m.mu.Lock()
	if m.revoked == nil {
		m.revoked = map[string]bool{}
	}
	m.revoked[id] = true
	m.mu.Unlock()
}

// RegistrationPool is how many clients the registration endpoint can hand
// out.
const RegistrationPool = 4

// RegisteredID is the client id the n-th registration (from 1) gets.
func RegisteredID(n int) string { return fmt.Sprintf("dcr-%d", n) }

// SetResource makes the protected-resource metadata name resource.
func (m *MCPAuth) SetResource(resource string) {
	m.mu.Lock()
	m.resource = resource
	m.mu.Unlock()
}

// SetIssuer makes the authorization-server metadata say issuer.
func (m *MCPAuth) SetIssuer(issuer string) {
	m.mu.Lock()
	m.issuer = issuer
	m.mu.Unlock()
}

// TokenResources returns the resource parameter of every token request.
func (m *MCPAuth) TokenResources() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.tokenRes...)
}

// AuthResources returns the resource parameter of every authorization
// request.
func (m *MCPAuth) AuthResources() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.authRes...)
}

// Seen returns every bearer token the MCP server was sent.
func (m *MCPAuth) Seen() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.seen...)
}

// StartMCP runs both servers on loopback ports. redirect is the
// gateway's callback, which registered clients may redirect to.
func StartMCP(t testing.TB, redirect string) *MCPAuth {
	t.Helper()
	asLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	mcpLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return StartMCPOn(t, asLn, mcpLn, redirect)
}

// StartMCPOn is StartMCP on the listeners given (inside a network
// namespace, say).
func StartMCPOn(t testing.TB, asLn, mcpLn net.Listener, redirect string) *MCPAuth {
	t.Helper()
	issuer := "http://" + asLn.Addr().String()
	clients := map[string]*storage.Client{}
	for i := 1; i <= RegistrationPool; i++ {
		clients[RegisteredID(i)] = storage.WebClient(RegisteredID(i), WebSecret, redirect)
	}
	st := storage.NewStorageWithClients(storage.NewUserStore(issuer), clients)
	router := exampleop.SetupServer(issuer, st, nil, false)
	s := &Server{URL: issuer, Storage: st, grants: map[string]int{}}
	m := &MCPAuth{AS: s, MCPURL: "http://" + mcpLn.Addr().String() + "/mcp"}

	as := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/.well-known/oauth-authorization-server":
			m.serveASMeta(w, r, router)
			return
		case "/register":
			m.register(w, r, redirect)
			return
		case "/oauth/token":
			if err := r.ParseForm(); err == nil {
				s.mu.Lock()
				s.grants[r.PostForm.Get("grant_type")]++
				s.mu.Unlock()
				id, _, ok := r.BasicAuth()
				if !ok {
					id = r.PostForm.Get("client_id")
				}
				m.mu.Lock()
				m.tokenRes = append(m.tokenRes, r.PostForm.Get("resource"))
				gone := m.revoked[id]
				m.mu.Unlock()
				if gone {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusUnauthorized)
					_, _ = w.Write([]byte(`{"error":"invalid_client","error_description":"client registration ended"}`))
					return
				}
			}
		case "/authorize", "/auth":
			m.mu.Lock()
			m.authRes = append(m.authRes, r.URL.Query().Get("resource"))
			m.mu.Unlock()
		}
		router.ServeHTTP(&recorder{ResponseWriter: w, s: s, redirect: redirect}, r)
	})
	ashs := &httptest.Server{Listener: asLn, Config: &http.Server{Handler: as}}
	ashs.Start()
	t.Cleanup(ashs.Close)

	srv := mcp.NewServer(&mcp.Implementation{Name: "remote-with-auth", Version: "1"}, nil)
	mcp.AddTool(srv, &mcp.Tool{Name: "whoami", Description: "the token's subject"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, struct {
			Subject string `json:"subject"`
		}, error) {
			out := struct {
				Subject string `json:"subject"`
			}{}
			if ti := req.Extra.TokenInfo; ti != nil {
				out.Subject = ti.UserID
			}
			return nil, out, nil
		})
	// echo_auth reflects the Authorization header it got: a gateway in
	// front must scrub it from the result (THREATS D, reflection).
	mcp.AddTool(srv, &mcp.Tool{Name: "echo_auth", Description: "echoes the credential"},
		func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
			return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "you sent " + req.Extra.Header.Get("Authorization")}}}, nil, nil
		})
	metaURL := "http://" + mcpLn.Addr().String() + "/.well-known/oauth-protected-resource/mcp"
	protect := auth.RequireBearerToken(m.verify, &auth.RequireBearerTokenOptions{ResourceMetadataURL: metaURL})
	mux := http.NewServeMux()
	guarded := protect(mcp.NewStreamableHTTPHandler(func(*http.Request) *mcp.Server { return srv }, nil))
	mux.HandleFunc("/mcp", func(w http.ResponseWriter, r *http.Request) {
		if m.NoChallenge.Load() {
			w = noChallenge{w}
		}
		guarded.ServeHTTP(w, r)
	})
	mux.HandleFunc("/.well-known/oauth-protected-resource/mcp", func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		res := m.resource
		m.mu.Unlock()
		if res == "" {
			res = m.MCPURL
		}
		auth.ProtectedResourceMetadataHandler(&oauthex.ProtectedResourceMetadata{
			Resource: res, AuthorizationServers: []string{issuer}, ScopesSupported: []string{"openid", "offline_access"},
		}).ServeHTTP(w, r)
	})
	mhs := &httptest.Server{Listener: mcpLn, Config: &http.Server{Handler: mux}}
	mhs.Start()
	t.Cleanup(mhs.Close)
	return m
}

// verify checks a token at op's userinfo endpoint: the subject it names
// is the token's user.
func (m *MCPAuth) verify(ctx context.Context, token string, _ *http.Request) (*auth.TokenInfo, error) {
	m.mu.Lock()
	m.seen = append(m.seen, token)
	m.mu.Unlock()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.AS.URL+"/userinfo", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var ui struct {
		Sub string `json:"sub"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&ui) != nil || ui.Sub == "" {
		return nil, fmt.Errorf("%w: userinfo answered %s", auth.ErrInvalidToken, resp.Status)
	}
	return &auth.TokenInfo{UserID: ui.Sub, Expiration: time.Now().Add(time.Minute)}, nil
}

// serveASMeta is op's OpenID configuration as an RFC 8414 document, with
// the registration endpoint added (and the issuer replaced when set).
func (m *MCPAuth) serveASMeta(w http.ResponseWriter, r *http.Request, op http.Handler) {
	rec := httptest.NewRecorder()
	op.ServeHTTP(rec, httptest.NewRequestWithContext(r.Context(), http.MethodGet, "/.well-known/openid-configuration", nil))
	var doc map[string]any
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &doc) != nil {
		http.Error(w, "no configuration", http.StatusInternalServerError)
		return
	}
	doc["registration_endpoint"] = m.AS.URL + "/register"
	m.mu.Lock()
	if m.issuer != "" {
		doc["issuer"] = m.issuer
	}
	m.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(doc)
}

// register is RFC 7591 3: the next pooled client, when the request asks
// for what it is (the authorization code grant to redirect, client secret
// basic).
func (m *MCPAuth) register(w http.ResponseWriter, r *http.Request, redirect string) {
	m.Registrations.Add(1)
	var req struct {
		RedirectURIs []string `json:"redirect_uris"`
		GrantTypes   []string `json:"grant_types"`
		AuthMethod   string   `json:"token_endpoint_auth_method"`
	}
	bad := func(code, desc string) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_ = json.NewEncoder(w).Encode(map[string]string{"error": code, "error_description": desc})
	}
	if r.Method != http.MethodPost || json.NewDecoder(r.Body).Decode(&req) != nil {
		bad("invalid_client_metadata", "not a JSON registration")
		return
	}
	if len(req.RedirectURIs) != 1 || req.RedirectURIs[0] != redirect {
		bad("invalid_redirect_uri", "unknown redirect")
		return
	}
	if req.AuthMethod != "client_secret_basic" || !strings.Contains(strings.Join(req.GrantTypes, " "), "authorization_code") {
		bad("invalid_client_metadata", "this server registers web clients")
		return
	}
	m.mu.Lock()
	m.nextClient++
	n := m.nextClient
	m.mu.Unlock()
	if n > RegistrationPool {
		bad("invalid_client_metadata", errors.New("registration pool exhausted").Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"client_id": RegisteredID(n), "client_secret": WebSecret, "redirect_uris": []string{redirect},
		"grant_types": []string{"authorization_code", "refresh_token"}, "token_endpoint_auth_method": "client_secret_basic",
	})
}

// noChallenge drops WWW-Authenticate from what it writes.
type noChallenge struct{ http.ResponseWriter }

func (n noChallenge) WriteHeader(code int) {
	n.Header().Del("WWW-Authenticate")
	n.ResponseWriter.WriteHeader(code)
}
