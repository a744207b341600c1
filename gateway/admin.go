package gateway

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/sluice-gw/sluice/gateway/creds"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/refusal"
)

// adminHandler serves people and monitoring, never sandboxes: health,
// readiness, metrics, the audit tail, the holds API (approvals.go) and,
// when set, the review UI at "/".
func (s *Server) adminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		refusal.WriteJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc("GET /readyz", s.handleReady)
	mux.Handle("GET /metrics", s.tel.handler)
	mux.HandleFunc("GET /.well-known/jwks.json", creds.JWKS(s.creds, s.log))
	// The audit tail names callers, tools and destinations: people only,
	// authenticated like the holds API (an approver's token or UI session).
	mux.HandleFunc("GET /api/v1/audit", s.withPerson(func(w http.ResponseWriter, r *http.Request, _ holds.Person) {
		s.handleAuditTail(w, r)
	}))
	s.adminHolds(mux)
	s.adminSessions(mux)      // sessions.go
	s.adminSandboxEvents(mux) // sandbox_events.go
	s.adminIntercept(mux)     // below
	s.adminReceipts(mux)      // policylife.go
	if s.reviewUI != nil {
		mux.Handle("/", s.reviewUI)
	} else {
		mux.HandleFunc("GET /{$}", s.handleIndex)
	}
	return mux
}

// handleReady is 200 only when a policy is loaded, the audit log takes
// writes and the store answers; otherwise 503 with the reasons, so a load balancer stops sending
// traffic that would be refused anyway.
func (s *Server) handleReady(w http.ResponseWriter, r *http.Request) {
	problems := []string{}
	if s.engine.Load() == nil {
		problems = append(problems, "policy: not loaded (every call is blocked)")
	}
	if p := s.policyErr.Load(); p != nil {
		problems = append(problems, "policy: last reload failed: "+*p)
	}
	if err := s.audit.Err(); err != nil {
		problems = append(problems, "audit: "+err.Error())
	}
	storeDown := s.storeProblem(r.Context())
	if storeDown != "" {
		problems = append(problems, storeDown)
	}
	status := http.StatusOK
	if len(problems) > 0 && (s.engine.Load() == nil || s.audit.Err() != nil || storeDown != "") {
		status = http.StatusServiceUnavailable
	}
	v := int64(0)
	if e := s.engine.Load(); e != nil {
		v = e.Version()
	}
	refusal.WriteJSON(w, status, map[string]any{"ready": status == http.StatusOK, "policy_version": v, "problems": problems})
}

// handleAuditTail returns the newest records of the audit log (?limit=N,
// default 100, at most 1000).
func (s *Server) handleAuditTail(w http.ResponseWriter, r *http.Request) {
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			refusal.Write(w, refusal.New(http.StatusBadRequest, refusal.BadRequest, "limit must be 1..1000"), refusal.NewRequestID())
			return
		}
		limit = n
	}
	f, err := os.Open(s.cfg.Audit.Path)
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

func (s *Server) handleIndex(w http.ResponseWriter, r *http.Request) {
	v := int64(0)
	if e := s.engine.Load(); e != nil {
		v = e.Version()
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'")
	if err := indexPage.Execute(w, struct {
		Tools   int
		Version int64
	}{len(s.catalog.Tools()), v}); err != nil {
		s.log.Warn("admin: index page", "err", fmt.Sprint(err))
	}
}

// adminIntercept routes GET /ca.pem (the interception CA's certificate,
// for sandbox trust stores; public: it is a certificate) and GET
// /api/v1/placeholders (what sandboxd puts in a sandbox's environment) on
// the admin listener. The placeholders are not secret values, but they are
// what the gateway swaps for one toward a bound host, so only sandboxd (a
// token of gateway.session_tokens_sha256) or an approver may read them:
// anyone else is 401 unauthenticated.
func (s *Server) adminIntercept(mux *http.ServeMux) {
	mux.HandleFunc("GET /ca.pem", func(w http.ResponseWriter, r *http.Request) {
		if s.icpt == nil {
			refusal.Write(w, refusal.New(http.StatusNotFound, refusal.NotFound, "TLS interception is not configured"), refusal.NewRequestID())
			return
		}
		w.Header().Set("Content-Type", "application/x-pem-file")
		_, _ = w.Write(s.icpt.CACertPEM())
	})
	mux.HandleFunc("GET /api/v1/placeholders", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := s.sessionCaller(r); !ok {
			refusal.WriteUnauthenticated(w, "an approver token or a session token is required", refusal.NewRequestID())
			return
		}
		refusal.WriteJSON(w, http.StatusOK, map[string]any{"placeholders": s.icpt.Placeholders()})
	})
}
