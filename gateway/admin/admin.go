// Package admin is the gateway's admin listener: health, readiness,
// metrics, the audit tail, the holds and grants API, session ends,
// sandbox hosts' reports, the interception CA and placeholders, approval
// receipts and, when set, the review UI at "/". It serves people and
// monitoring, never sandboxes. The root hands it what it reads and calls
// as Deps (hooks and the few managers it drives); it never imports the
// root, and it decides no tool call.
package admin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strconv"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/receipts"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/policy"
)

// Deps is what the admin API reads and calls. Config, Log, Store and Audit
// are required; a nil hook or manager turns its route off as documented
// on the field.
type Deps struct {
	Config *config.Config // approvers, gateway.session_tokens_sha256, audit.path
	Log    *slog.Logger
	// Holds decides held calls and grants; nil: the holds, grants and
	// receipt routes answer 503 approval_unavailable.
	Holds *holds.Manager
	// Store records session ends and cuts their holds.
	Store *store.Store
	// Audit appends one record (the session ends and sandbox reports are
	// audited before they are answered).
	Audit func(ctx context.Context, rec audit.Record) error

	// Readiness: the policy in force (nil: none loaded), the last reload's
	// error ("" when healthy), the audit log's failure, and the store's
	// problem ("" when it answers).
	Policy       func() *policy.Engine
	PolicyErr    func() string
	AuditErr     func() error
	StoreProblem func(ctx context.Context) string

	Metrics http.Handler // GET /metrics
	JWKS    http.Handler // GET /.well-known/jwks.json
	Tools   func() int   // the index page's count of tools loaded

	// CACert is the interception CA's certificate in PEM; nil (the func):
	// interception is off and /ca.pem is 404. Placeholders is what
	// sandboxd puts in a sandbox's environment (encoded as JSON as is).
	CACert       func() []byte
	Placeholders func() any

	// CloseSession ends a session's open connections and tunnels and says
	// how many. EndSession revokes what the session was given (the
	// credential source's SessionEnder); nil: nothing to revoke.
	CloseSession func(session string) int
	EndSession   func(ctx context.Context, session string) error
	// MintToken mints a hosted sandbox's per-run token (gateway/hosted's
	// MintToken) for the machine caller by, authenticated here as
	// request rid; nil: 404 not_found (gateway.hosted off).
	MintToken func(w http.ResponseWriter, r *http.Request, rid, by string)

	Receipts *receipts.Signer // nil: receipts are disabled

	// Person authenticates people besides bearer tokens (the review UI's
	// cookie sessions); UI is the review UI, mounted at "/" instead of
	// the index page. Both may be nil.
	Person func(*http.Request) (holds.Person, bool)
	UI     http.Handler
}

// API is the admin listener's handler over its Deps.
type API struct{ d Deps }

// New returns the admin API over d.
func New(d Deps) *API { return &API{d: d} }

// Handler serves people and monitoring, never sandboxes: health,
// readiness, metrics, the audit tail, the holds API (approvals.go) and,
// when set, the review UI at "/".
func (a *API) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		refusal.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", a.handleReady)
	mux.Handle("GET /metrics", a.d.Metrics)
	mux.Handle("GET /.well-known/jwks.json", a.d.JWKS)
	// The audit tail names callers, tools and destinations: people only,
	// authenticated like the holds API (an approver's token or UI session).
	mux.HandleFunc("GET /api/v1/audit", a.withPerson(func(w http.ResponseWriter, r *http.Request, _ holds.Person) {
		a.handleAuditTail(w, r)
	}))
	a.routeHolds(mux)         // approvals.go
	a.routeSessions(mux)      // sessions.go
	a.routeSandboxEvents(mux) // sessions.go
	a.routeIntercept(mux)     // below
	a.routeReceipts(mux)      // approvals.go
	if a.d.UI != nil {
		mux.Handle("/", a.d.UI)
	} else {
		mux.HandleFunc("GET /{$}", a.handleIndex)
	}
	return mux
}

// handleReady is 200 only when a policy is loaded, the audit log takes
// writes and the store answers; otherwise 503 with the reasons, so a load balancer stops sending
// traffic that would be refused anyway.
func (a *API) handleReady(w http.ResponseWriter, r *http.Request) {
	problems := []string{}
	if a.d.Policy() == nil {
		problems = append(problems, "policy: not loaded (every call is blocked)")
	}
	if p := a.d.PolicyErr(); p != "" {
		problems = append(problems, "policy: last reload failed: "+p)
	}
	if err := a.d.AuditErr(); err != nil {
		problems = append(problems, "audit: "+err.Error())
	}
	storeDown := a.d.StoreProblem(r.Context())
	if storeDown != "" {
		problems = append(problems, storeDown)
	}
	status := http.StatusOK
	if len(problems) > 0 && (a.d.Policy() == nil || a.d.AuditErr() != nil || storeDown != "") {
		status = http.StatusServiceUnavailable
	}
	v := int64(0)
	if e := a.d.Policy(); e != nil {
		v = e.Version()
	}
	refusal.WriteJSON(w, status, map[string]any{"ready": status == http.StatusOK, "policy_version": v, "problems": problems})
}

// handleAuditTail returns the newest records of the audit log (?limit=N,
// default 100, at most 1000).
func (a *API) handleAuditTail(w http.ResponseWriter, r *http.Request) {
	limit, ok := limitParam(w, r, 100)
	if !ok {
		return
	}
	f, err := os.Open(a.d.Config.Audit.Path)
	if err != nil {
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be read"), refusal.NewRequestID())
		return
	}
	defer f.Close()
	lines, err := tailLines(f, limit)
	if err != nil {
		refusal.Write(w, refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be read"), refusal.NewRequestID())
		return
	}
	recs := make([]json.RawMessage, 0, len(lines))
	for _, l := range lines {
		if json.Valid(l) {
			recs = append(recs, json.RawMessage(l))
		}
	}
	refusal.WriteJSON(w, http.StatusOK, map[string]any{"records": recs})
}

// limitParam is the request's ?limit=N, 1..1000, or def when it has
// none; any other value is answered 400 bad_request and ok is false.
func limitParam(w http.ResponseWriter, r *http.Request, def int) (n int, ok bool) {
	v := r.URL.Query().Get("limit")
	if v == "" {
		return def, true
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 1000 {
		refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "limit must be 1..1000"), refusal.NewRequestID())
		return 0, false
	}
	return n, true
}

// tailLines returns the last n lines of r.
func tailLines(r io.Reader, n int) ([][]byte, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	ring := make([][]byte, 0, n)
	for sc.Scan() {
		if len(ring) == n {
			ring = ring[1:]
		}
		ring = append(ring, bytes.Clone(sc.Bytes()))
	}
	return ring, sc.Err()
}

var indexPage = template.Must(template.New("index").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sluice gateway</title></head>
<body><h1>sluice gateway</h1>
<p>{{.Tools}} tools loaded; policy version {{.Version}}.</p>
<ul><li><a href="/readyz">/readyz</a></li><li><a href="/metrics">/metrics</a></li>
<li><a href="/api/v1/audit">/api/v1/audit</a></li></ul>
<p>Held calls: <code>sluice approvals list</code> or <code>/api/v1/holds</code> (with an approver token).</p></body></html>`))

func (a *API) handleIndex(w http.ResponseWriter, r *http.Request) {
	v := int64(0)
	if e := a.d.Policy(); e != nil {
		v = e.Version()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	if err := indexPage.Execute(w, struct {
		Tools   int
		Version int64
	}{a.d.Tools(), v}); err != nil {
		a.d.Log.Warn("admin: index page", "err", fmt.Sprint(err))
	}
}

// routeIntercept routes GET /ca.pem (the interception CA's certificate,
// for sandbox trust stores; public: it is a certificate) and GET
// /api/v1/placeholders (what sandboxd puts in a sandbox's environment) on
// the admin listener. The placeholders are not secret values, but they are
// what the gateway swaps for one toward a bound host, so only sandboxd (a
// token of gateway.session_tokens_sha256) or an approver may read them:
// anyone else is 401 unauthenticated.
func (a *API) routeIntercept(mux *http.ServeMux) {
	mux.HandleFunc("GET /ca.pem", func(w http.ResponseWriter, r *http.Request) {
		if a.d.CACert == nil {
			refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "TLS interception is not configured"), refusal.NewRequestID())
			return
		}
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(a.d.CACert())
	})
	mux.HandleFunc("GET /api/v1/placeholders", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := a.sessionCaller(r); !ok {
			refusal.WriteUnauthenticated(w, "an approver token or a session token is required", refusal.NewRequestID())
			return
		}
		refusal.WriteJSON(w, http.StatusOK, map[string]any{"placeholders": a.d.Placeholders()})
	})
}
