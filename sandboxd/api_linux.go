package sandboxd

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// Is makes a CeilingError an ErrInvalid (400).
func (e *CeilingError) Is(target error) bool { return target == ErrInvalid }

// maxBody bounds an API request body (files are bounded by file_bytes).
const maxBody = 1 << 20

// ExecBody is POST /v1/sandboxes/{id}/exec (durations in milliseconds).
type ExecBody struct {
	Argv        []string          `json:"argv"`
	Stdin       string            `json:"stdin,omitempty"`
	Env         map[string]string `json:"env,omitempty"`
	TimeoutMS   int64             `json:"timeout_ms,omitempty"`
	OutputBytes int               `json:"output_bytes,omitempty"`
}

// CreateBody is POST /v1/sandboxes (durations in milliseconds).
type CreateBody struct {
	Template   string            `json:"template,omitempty"` // a configured template's name
	Agent      string            `json:"agent"`
	Session    string            `json:"session,omitempty"`
	User       string            `json:"user,omitempty"`
	Limits     Limits            `json:"limits,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	LifetimeMS int64             `json:"lifetime_ms,omitempty"`
	Egress     []string          `json:"egress,omitempty"`
}

// Handler serves the API; mount it on a Unix socket only root can reach.
func (m *Manager) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var b CreateBody
		if !decode(w, r, &b) {
			return
		}
		life, err := millis("lifetime_ms", b.LifetimeMS)
		if err != nil {
			fail(w, err)
			return
		}
		in, err := m.Create(r.Context(), CreateRequest{Template: b.Template, Agent: b.Agent, Session: b.Session, User: b.User,
			Limits: b.Limits, Env: b.Env, Lifetime: life, Egress: b.Egress})
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusCreated, in)
	})
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, m.List())
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		in, err := m.Get(r.PathValue("id"))
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, in)
	})
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := m.Destroy(r.PathValue("id")); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		var b ExecBody
		if !decode(w, r, &b) {
			return
		}
		timeout, err := millis("timeout_ms", b.TimeoutMS)
		if err != nil {
			fail(w, err)
			return
		}
		req := ExecRequest{Argv: b.Argv, Env: b.Env, Timeout: timeout, OutputBytes: b.OutputBytes}
		if b.Stdin != "" {
			req.Stdin = stringsReader(b.Stdin)
		}
		res, err := m.Exec(r.Context(), r.PathValue("id"), req)
		if err != nil && res.Millis == 0 {
			fail(w, err)
			return
		}
		reply(w, http.StatusOK, res)
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		mode := os.FileMode(0o644)
		if s := r.URL.Query().Get("mode"); s != "" {
			n, err := strconv.ParseUint(s, 8, 32)
			if err != nil {
				fail(w, fmt.Errorf("%w: mode %q", ErrInvalid, s))
				return
			}
			mode = os.FileMode(n)
		}
		if err := m.PutFile(r.PathValue("id"), r.PathValue("path"), r.Body, mode); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/{path...}", func(w http.ResponseWriter, r *http.Request) {
		// Read fully first so a failure is still an error status.
		var buf bytesBuffer
		if err := m.GetFile(r.PathValue("id"), r.PathValue("path"), &buf); err != nil {
			fail(w, err)
			return
		}
		w.Header().Set("Content-Type", "application/octet-stream")
		_, _ = w.Write(buf.Bytes())
	})
	mux.HandleFunc("POST /v1/pin", func(w http.ResponseWriter, r *http.Request) {
		var b PinRequest
		if !decode(w, r, &b) {
			return
		}
		in, err := m.Pin(r.Context(), b)
		if err != nil {
			fail(w, err)
			return
		}
		reply(w, http.StatusCreated, in)
	})
	mux.HandleFunc("GET /v1/pins", func(w http.ResponseWriter, r *http.Request) {
		reply(w, http.StatusOK, m.Pins())
	})
	mux.HandleFunc("DELETE /v1/pins/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := m.Unpin(r.PathValue("id")); err != nil {
			fail(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	m.podRoutes(mux)
	return mux
}

// millis converts a request's milliseconds to a duration, refusing values
// whose nanoseconds would not fit (they would wrap to another value than
// the one checked against the ceiling).
func millis(key string, ms int64) (time.Duration, error) {
	if ms > int64(math.MaxInt64/time.Millisecond) || ms < int64(math.MinInt64/time.Millisecond) {
		return 0, fmt.Errorf("%w: %s: %d is out of range", ErrInvalid, key, ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fail(w, fmt.Errorf("%w: body: %w", ErrInvalid, err))
		return false
	}
	if dec.More() {
		fail(w, fmt.Errorf("%w: body: trailing data", ErrInvalid))
		return false
	}
	return true
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// fail maps an error to a status and a stable code.
func fail(w http.ResponseWriter, err error) {
	code, status := "internal", http.StatusInternalServerError
	var ce *CeilingError
	switch {
	case errors.Is(err, ErrNotFound):
		code, status = "not_found", http.StatusNotFound
	case errors.As(err, &ce) && ce.Ceiling != "":
		code, status = "above_ceiling", http.StatusBadRequest
	case errors.Is(err, ErrInvalid):
		code, status = "bad_request", http.StatusBadRequest
	case errors.Is(err, ErrTooLarge):
		code, status = "too_large", http.StatusRequestEntityTooLarge
	case errors.Is(err, ErrDenied):
		code, status = "forbidden", http.StatusForbidden
	case errors.Is(err, ErrEgress):
		code, status = "egress_not_granted", http.StatusForbidden
	case errors.Is(err, ErrConflict):
		code, status = "conflict", http.StatusConflict
	case errors.Is(err, ErrFailed):
		code, status = "sandbox_failed", http.StatusConflict
	case errors.Is(err, ErrFull):
		code, status = "no_capacity", http.StatusServiceUnavailable
	}
	reply(w, status, map[string]any{"error": map[string]string{"code": code, "message": err.Error()}})
}

type bytesBuffer = bytes.Buffer

func stringsReader(s string) *strings.Reader { return strings.NewReader(s) }
