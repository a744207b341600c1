package hosted

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/runtoken"
	"github.com/sluice-gw/sluice/gateway/store"
)

// door is a Door over a real token key, a real SQLite store and a real
// hash-chained audit log, as the root wires it (without a listener).
type door struct {
	*Door
	key   *runtoken.Key
	st    *store.Store
	log   *audit.Log
	audit string // the audit log's path
}

func newDoor(t *testing.T) *door {
	t.Helper()
	dir := t.TempDir()
	key, err := runtoken.LoadKey(filepath.Join(dir, "token.key"), true)
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(context.Background(), "sqlite:"+filepath.Join(dir, "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	path := filepath.Join(dir, "audit.log")
	al, err := audit.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { al.Close() })
	cfg := config.Defaults()
	cfg.Agents = []config.Agent{{Name: "agent-a"}}
	cfg.Gateway.Hosted = &config.Hosted{MaxTokenTTL: config.Duration(2 * time.Hour)}
	d := New(Deps{Config: cfg, Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Ended: st.SessionEnded,
		Append: func(ctx context.Context, rec audit.Record, _ bool) (audit.Record, error) { return al.Append(ctx, rec) }})
	d.key.Store(key) // what Serve does before it listens
	return &door{Door: d, key: key, st: st, log: al, audit: path}
}

func (d *door) mint(t *testing.T, c runtoken.Claims) string {
	t.Helper()
	tok, err := d.key.Mint(c)
	if err != nil {
		t.Fatal(err)
	}
	return string(tok)
}

// records are the audit log's records, its chain verified.
func (d *door) records(t *testing.T) []audit.Record {
	t.Helper()
	var recs []audit.Record
	ch, err := audit.Scan(d.audit, func(e audit.Entry) { recs = append(recs, e.Record) })
	if err != nil || ch.Break != nil || ch.Verified != len(recs) {
		t.Fatalf("audit log: %v, chain %+v, %d records", err, ch, len(recs))
	}
	return recs
}

// TestCheck: the hosted listener's check admits a token only with its
// MAC, before its expiry, under the Basic user naming its session
// (compared canonically) and for a session the store says has not
// ended; a store that cannot answer refuses (fail closed). The identity
// is the token's only when its MAC verified.
func TestCheck(t *testing.T) {
	d := newDoor(t)
	now := time.Now()
	claims := runtoken.Claims{Sandbox: "sb-1", Agent: "agent-a", Session: "h-1", User: "alice", Issued: now.Unix(), Expires: now.Add(time.Hour).Unix()}
	good := d.mint(t, claims)
	expired := claims
	expired.Issued, expired.Expires = now.Add(-2*time.Hour).Unix(), now.Add(-time.Hour).Unix()
	otherKey, err := runtoken.LoadKey(filepath.Join(t.TempDir(), "other.key"), true)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := otherKey.Mint(claims)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	if v := New(d.d).check(ctx, "h-1", good); v.Refused != "hosted_off" || v.ID.Session != "" {
		t.Fatalf("a door without its key: %+v, want hosted_off", v)
	}
	for _, tc := range []struct {
		name, session, token, refused string
		authentic                     bool // the identity is the token's
	}{
		{"good", "h-1", good, "", true},
		{"the session's other spelling", "H-1", good, "", true},
		{"another session's name", "h-2", good, "session_mismatch", true},
		{"expired", "h-1", d.mint(t, expired), "expired", true},
		{"another key's token", "h-1", string(foreign), "bad_mac", false},
		{"not a token", "h-1", "hunter2", "malformed", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := d.check(ctx, tc.session, tc.token)
			if v.Refused != tc.refused || v.Unavailable {
				t.Fatalf("refused %q unavailable %v, want %q", v.Refused, v.Unavailable, tc.refused)
			}
			if tc.authentic != (v.ID.Session == "h-1") {
				t.Fatalf("identity %+v (authentic: %v)", v.ID, tc.authentic)
			}
			if tc.authentic && (v.ID.Host != Host || v.ID.User != "alice" || v.ID.Sandbox != "sb-1" || v.TokenID == "") {
				t.Fatalf("identity %+v token %q, want the token's claims on host %q", v.ID, v.TokenID, Host)
			}
		})
	}

	if _, _, err := d.st.EndSession(ctx, "h-1", "test", now); err != nil {
		t.Fatal(err)
	}
	if v := d.check(ctx, "h-1", good); v.Refused != "session_ended" {
		t.Fatalf("an ended session's token: %+v, want session_ended", v)
	}
	d.st.Close()
	if v := d.check(ctx, "h-3", d.mint(t, runtoken.Claims{Agent: "agent-a", Session: "h-3", Expires: now.Add(time.Hour).Unix()})); v.Refused != "session_unavailable" || !v.Unavailable {
		t.Fatalf("a store that cannot answer: %+v, want session_unavailable, unavailable", v)
	}
}

// mintReq calls MintToken as the admin API does for a machine caller.
func (d *door) mintReq(t *testing.T, session, body string) (int, map[string]any) {
	t.Helper()
	r := httptest.NewRequest("POST", "/api/v1/sessions/"+session+"/tokens", strings.NewReader(body))
	r.SetPathValue("session", session)
	w := httptest.NewRecorder()
	d.MintToken(w, r, "rid-1", "platform")
	var out map[string]any
	if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil {
		t.Fatalf("answer %q: %v", w.Body.String(), err)
	}
	return w.Code, out
}

func code(out map[string]any) string {
	e, _ := out["error"].(map[string]any)
	s, _ := e["code"].(string)
	return s
}

// TestMintFailsClosed: a token is given only when its mint is audited
// and its session is known not to have ended; the audit record names the
// token's id, never the token.
func TestMintFailsClosed(t *testing.T) {
	t.Run("minted and audited", func(t *testing.T) {
		d := newDoor(t)
		st, out := d.mintReq(t, "M-1", `{"agent":"agent-a","user":"Bob","ttl":"10m"}`)
		if st != http.StatusOK {
			t.Fatalf("mint: %d %q", st, code(out))
		}
		tok, _ := out["token"].(map[string]any)
		raw, _ := tok["token"].(string)
		c, err := d.key.Check(raw, time.Now())
		if err != nil || c.Session != "m-1" || c.User != "bob" || c.Sandbox != "m-1" || tok["token_id"] != c.Nonce {
			t.Fatalf("minted token: claims %+v, %v; answer's token_id %v", c, err, tok["token_id"])
		}
		data, _ := os.ReadFile(d.audit)
		if strings.Contains(string(data), raw) || strings.Contains(string(data), raw[strings.LastIndexByte(raw, '.')+1:]) {
			t.Fatal("the audit log holds the token")
		}
		recs := d.records(t)
		if len(recs) != 1 || recs[0].Event != "session_token_minted" || recs[0].Fields["token_id"] != c.Nonce || recs[0].Fields["by"] != "platform" {
			t.Fatalf("audit records: %+v", recs)
		}
	})
	for _, tc := range []struct {
		name   string
		edit   func(d *door)
		status int
		code   string
	}{
		{"the audit log cannot be written", func(d *door) { d.log.Close() }, http.StatusServiceUnavailable, "audit_unavailable"},
		{"the store cannot say whether the session ended", func(d *door) { d.st.Close() }, http.StatusServiceUnavailable, "session_unavailable"},
		{"the session has ended", func(d *door) {
			if _, _, err := d.st.EndSession(context.Background(), "m-1", "test", time.Now()); err != nil {
				t.Fatal(err)
			}
		}, http.StatusConflict, "session_ended"},
		{"hosted sandboxes are off", func(d *door) { d.Door = New(d.d) }, http.StatusNotFound, "not_found"},
		{"an ambiguous user", func(*door) {}, http.StatusBadRequest, "bad_request"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := newDoor(t)
			tc.edit(d)
			user := "bob"
			if tc.code == "bad_request" {
				user = "b\u043eb" // Latin and Cyrillic letters: refused, not guessed at
			}
			st, out := d.mintReq(t, "m-1", `{"agent":"agent-a","user":"`+user+`"}`)
			_, given := out["token"] // never printed: it is the secret
			if st != tc.status || code(out) != tc.code || given {
				t.Fatalf("%d %q (a token given: %v), want %d %s and no token", st, code(out), given, tc.status, tc.code)
			}
			if tc.code != "audit_unavailable" && len(d.records(t)) != 0 {
				t.Fatalf("a refused mint was recorded as minted: %+v", d.records(t))
			}
		})
	}
}
