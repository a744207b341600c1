package e2e

import (
	"crypto/sha256"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

// vaultGatewayPolicy is what the gateway's AppRole may do in these tests.
const vaultGatewayPolicy = `
path "secret/data/*" { capabilities = ["read"] }
path "database/creds/*" { capabilities = ["read"] }
path "sys/leases/renew" { capabilities = ["update"] }
path "sys/leases/revoke" { capabilities = ["update"] }
`

// vaultWorld is a real Vault dev server and PostgreSQL inside the test's
// namespace, with the KV value the tickets connector uses (e.Secret, so the
// D9 sweep of replies, logs and files covers it) and a database role.
type vaultWorld struct {
	srv *vaulttest.Server
	pg  *vaulttest.Postgres
	rid string // role_id file
	sid string // secret_id file
}

func newVaultWorld(t *testing.T, e *gwenv.Env, withDB bool) *vaultWorld {
	t.Helper()
	in := vaulttest.Net(e.NS.Do)
	w := &vaultWorld{srv: vaulttest.StartIn(t, in)}
	w.srv.Write(t, "secret/data/tickets", map[string]any{"data": map[string]any{"api_key": e.Secret}})
	if withDB {
		w.pg = vaulttest.StartPostgresIn(t, in)
		w.srv.Mount(t, "database", "database")
		w.srv.Write(t, "database/config/pg", map[string]any{
			"plugin_name": "postgresql-database-plugin", "allowed_roles": "ro",
			"connection_url": w.pg.ConnectionURL(), "username": "postgres", "password": w.pg.Password,
		})
		w.srv.Write(t, "database/roles/ro", map[string]any{
			"db_name":             "pg",
			"creation_statements": `CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}';`,
			"default_ttl":         "1m", "max_ttl": "10m",
		})
	}
	w.rid, w.sid = w.srv.AppRole(t, t.TempDir(), "gateway", vaultGatewayPolicy, "1h")
	return w
}

// vaultConfig is the configuration stem with secrets.backend vault, the
// connectors given (at the loopback upstream, every tool allowed to
// agent-a) and sandboxd's session token, which ends sessions.
func vaultConfig(e *gwenv.Env, w *vaultWorld, stem, cacheTTL string, conns []map[string]any, sessionToken string, authExtra map[string]any) gwenv.Doc {
	d := e.CoreConfig(stem)
	auth := map[string]any{"method": "approle", "role_id_file": w.rid, "secret_id_file": w.sid}
	for k, v := range authExtra {
		auth[k] = v
	}
	d["secrets"] = map[string]any{"backend": "vault", "vault": map[string]any{
		"address": w.srv.Addr, "cache_ttl": cacheTTL, "timeout": "2s", "auth": auth,
	}}
	var slugs []string
	for _, c := range conns {
		c["spec"] = e.Spec
		c["base_url"] = fmt.Sprintf("http://127.0.0.1:%d", e.Up.Port)
		c["allow_private"] = []string{"127.0.0.0/8"}
		slugs = append(slugs, c["slug"].(string))
	}
	d["connectors"] = conns
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": slugs}}
	d["policies"] = []map[string]any{{"match": "*", "action": "allow"}}
	d.Gateway()["session_tokens_sha256"] = []string{fmt.Sprintf("%x", sha256.Sum256([]byte(sessionToken)))}
	return d
}

// TestVaultKVOutage: a KV credential from a real Vault reaches the upstream;
// with Vault stopped or sealed the cached value serves until cache_ttl, then
// every call is 503 credential_unavailable with nothing dialled and no stale
// value (G3). Vault refusing requests because its audit device fails is the
// same outage to the gateway (G4).
func TestVaultKVOutage(t *testing.T) {
	for _, how := range []string{"stopped", "sealed", "audit device failing"} {
		t.Run(how, func(t *testing.T) {
			id, threat := "G3", "Vault "+how+" while the gateway runs (cache_ttl 3s)"
			if how == "audit device failing" {
				id, threat = "G4", "Vault's only audit device (a socket) goes away while the gateway runs"
			}
			cb := casebook.Expect(t, id, threat, "cached value until cache_ttl, then 503 credential_unavailable, no upstream connection, no stale secret")
			e := newEnv(t)
			w := newVaultWorld(t, e, false)
			var auditConns atomic.Int64
			var auditLn net.Listener
			var connMu sync.Mutex
			var conns []net.Conn
			if how == "audit device failing" {
				// A socket audit device: while it accepts, Vault serves;
				// once it is gone, Vault refuses every request (it never
				// serves without an audit trail).
				if err := e.NS.Do(func() (err error) { auditLn, err = net.Listen("tcp", "127.0.0.1:0"); return err }); err != nil {
					t.Fatal(err)
				}
				go func() {
					for {
						c, err := auditLn.Accept()
						if err != nil {
							return
						}
						auditConns.Add(1)
						connMu.Lock()
						conns = append(conns, c)
						connMu.Unlock()
						go func() {
							buf := make([]byte, 32<<10)
							for {
								if _, err := c.Read(buf); err != nil {
									c.Close()
									return
								}
							}
						}()
					}
				}()
				if err := w.srv.Client(t).Sys().EnableAuditWithOptions("sock", &api.EnableAuditOptions{Type: "socket", Options: map[string]string{"address": auditLn.Addr().String(), "socket_type": "tcp", "write_timeout": "500ms"}}); err != nil {
					t.Fatalf("enable socket audit: %v", err)
				}
			}
			d := vaultConfig(e, w, "vault-"+strings.ReplaceAll(how, " ", "-"), "3s",
				[]map[string]any{{"slug": "tickets", "credential": map[string]any{"vault": map[string]any{"kv": "secret/data/tickets", "field": "api_key"}}}}, "tok-sandboxd", nil)
			g := e.Start(d, e.Write(d))

			r := g.Call(agentA, "tickets.list_tickets", `{}`)
			expect(t, r, http.StatusOK, "")
			reqs := e.Up.Requests()
			if len(reqs) != 1 || reqs[0].Header.Get("X-Api-Key") != e.Secret {
				t.Fatalf("the upstream did not receive the Vault KV value (%d requests)", len(reqs))
			}
			down := time.Now()
			switch how {
			case "stopped":
				w.srv.Stop()
			case "sealed":
				w.srv.Seal(t)
			default:
				// The device's endpoint goes away: no listener, and the
				// connection Vault holds is closed.
				auditLn.Close()
				connMu.Lock()
				for _, c := range conns {
					c.Close()
				}
				connMu.Unlock()
			}
			if r := g.Call(agentA, "tickets.list_tickets", `{}`); time.Since(down) < 3*time.Second {
				expect(t, r, http.StatusOK, "")
			}
			time.Sleep(time.Until(down.Add(3500 * time.Millisecond)))
			before := e.Up.Accepts.Load()
			r = g.Call(agentA, "tickets.list_tickets", `{}`)
			if how == "audit device failing" && auditConns.Load() == 0 {
				t.Error("Vault never connected to its socket audit device: the control did not exercise it")
			}
			expect(t, r, http.StatusServiceUnavailable, "credential_unavailable")
			if got := e.Up.Accepts.Load(); got != before {
				t.Errorf("the upstream got %d connections after the credential expired", got-before)
			}
			if strings.Contains(strings.ToLower(string(r.Body)), "vault") || strings.Contains(string(r.Body), w.srv.Addr) {
				t.Errorf("the refusal carries Vault's error: %s", r.Body)
			}
			var audited bool
			for _, rec := range g.AuditRecords() {
				if rec["request_id"] == r.RequestID {
					if f, _ := rec["fields"].(map[string]any); f != nil && f["code"] == "credential_unavailable" {
						audited = true
					}
				}
			}
			if !audited {
				t.Errorf("no audit record with code credential_unavailable for %s", r.RequestID)
			}
			cb.Observef("within ttl 200; after %s: %d %s, %d upstream connections, audited=%v", time.Since(down).Round(100*time.Millisecond), r.Status, r.Code, e.Up.Accepts.Load()-before, audited)
		})
	}
}

// TestVaultSessionEndRevokes: a dynamic PostgreSQL credential is leased per
// session; when the session ends (as sandboxd's destroy ends it) the lease
// is revoked, the database user is gone and the credential an attacker
// captured from the upstream no longer logs in (D7). The Vault token and
// every value stay out of replies, logs and the audit (D1, D9 via env).
func TestVaultSessionEndRevokes(t *testing.T) {
	cb := casebook.Expect(t, "D7", "session ends (sandbox destroyed) while its leased PostgreSQL credential is captured",
		"lease revoked: the database role is dropped and the captured password no longer logs in; another session's lease untouched")
	e := newEnv(t)
	w := newVaultWorld(t, e, true)
	d := vaultConfig(e, w, "vault-db", "60s",
		[]map[string]any{{"slug": "tickets", "credential": map[string]any{"vault": map[string]any{"dynamic": "database/creds/ro"}}}}, "tok-sandboxd", nil)
	g := e.Start(d, e.Write(d))

	other := wire.Identity{Sandbox: "sb-9", Agent: "agent-a", Session: "s-other", User: "carol"}
	captured := func(id wire.Identity) (user, pass string) {
		t.Helper()
		n := len(e.Up.Requests())
		expect(t, g.Call(id, "tickets.list_tickets", `{}`), http.StatusOK, "")
		reqs := e.Up.Requests()
		if len(reqs) != n+1 {
			t.Fatalf("upstream saw %d new requests", len(reqs)-n)
		}
		u, p, ok := strings.Cut(reqs[n].Header.Get("X-Api-Key"), ":")
		if !ok || !strings.HasPrefix(u, "v-") {
			t.Fatalf("the upstream did not get a Vault-made user:password")
		}
		return u, p
	}
	user, pass := captured(agentA)
	otherUser, otherPass := captured(other)
	if user == otherUser {
		t.Fatal("two sessions share one dynamic credential")
	}
	if _, err := w.pg.Query(t.Context(), user, pass, "select 1"); err != nil {
		t.Fatalf("the leased credential does not log in during the session: %v", err)
	}
	if st, _, _ := g.AdminDo(http.MethodPost, "/api/v1/sessions/"+agentA.Session+"/end", "tok-sandboxd", ""); st != http.StatusOK {
		t.Fatalf("session end: %d", st)
	}
	roles := w.pg.Super(t, "select count(*) from pg_roles where rolname = '"+user+"'")
	_, loginErr := w.pg.Query(t.Context(), user, pass, "select 1")
	if roles != "0" || loginErr == nil || !strings.Contains(loginErr.Error(), "authentication failed") {
		t.Errorf("after the end: role count %s, login err %v; want 0 and password authentication failed", roles, loginErr)
	}
	if _, err := w.pg.Query(t.Context(), otherUser, otherPass, "select 1"); err != nil {
		t.Errorf("ending one session revoked another's credential: %v", err)
	}
	r := g.Call(agentA, "tickets.list_tickets", `{}`)
	expect(t, r, http.StatusForbidden, "session_ended")
	cb.Observef("role count %s after end; captured login: %v; other session still logs in; later call %d %s", roles, loginErr, r.Status, r.Code)

	// D1: nothing the sandbox reads carries a Vault credential: the agent's
	// replies hold neither the gateway's role credentials nor a value.
	d1 := casebook.Expect(t, "D1", "the agent reads every reply it got while Vault credentials were attached",
		"no Vault token, secret_id, role_id or credential value in any reply")
	sid, _ := os.ReadFile(w.sid)
	rid, _ := os.ReadFile(w.rid)
	replies := e.Kept()
	hits := 0
	for _, rep := range replies {
		for _, s := range []string{string(sid), string(rid), w.srv.RootToken, pass, otherPass} {
			if s != "" && strings.Contains(string(rep), s) {
				hits++
			}
		}
	}
	if hits != 0 {
		t.Errorf("D1: %d replies carry a Vault credential", hits)
	}
	for _, s := range []string{string(sid), w.srv.RootToken, pass} {
		if strings.Contains(string(g.Stderr()), s) {
			t.Error("the gateway log carries a Vault credential")
		}
	}
	d1.Observef("%d replies scanned, %d hits; gateway log clean", len(replies), hits)
}

// TestVaultWrappedSecretIDReused: the gateway is given a response-wrapped
// secret_id that someone else already unwrapped: it refuses to start and
// says so (D8); a fresh wrapping token starts it (control).
func TestVaultWrappedSecretIDReused(t *testing.T) {
	cb := casebook.Expect(t, "D8", "the gateway's wrapped AppRole secret_id was unwrapped by someone else first",
		"the gateway does not start; it logs an ALERT that the wrapped secret may be compromised")
	e := newEnv(t)
	w := newVaultWorld(t, e, false)
	wrap := func() string {
		c := w.srv.Client(t)
		c.SetWrappingLookupFunc(func(string, string) string { return "120s" })
		sec, err := c.Logical().Write("auth/approle/role/gateway/secret-id", nil)
		if err != nil || sec.WrapInfo == nil {
			t.Fatalf("wrapped secret-id: %v", err)
		}
		return sec.WrapInfo.Token
	}
	start := func(name, tok string) *gwenv.Gateway {
		if err := os.WriteFile(w.sid, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		d := vaultConfig(e, w, name, "60s",
			[]map[string]any{{"slug": "tickets", "credential": map[string]any{"vault": map[string]any{"kv": "secret/data/tickets", "field": "api_key"}}}}, "tok-sandboxd",
			map[string]any{"secret_id_wrapped": true})
		return e.Launch(d, e.Write(d))
	}
	good := start("vault-wrap-ok", wrap())
	good.AwaitSocket()
	good.AwaitReady()
	expect(t, good.Call(agentA, "tickets.list_tickets", `{}`), http.StatusOK, "")
	good.Stop()

	tok := wrap()
	if _, err := w.srv.Client(t).Logical().Unwrap(tok); err != nil { // the thief
		t.Fatal(err)
	}
	bad := start("vault-wrap-stolen", tok)
	select {
	case <-bad.Exited():
	case <-time.After(30 * time.Second):
		t.Fatal("the gateway started with a stolen wrapping token")
	}
	logs := string(bad.Stderr())
	if bad.ExitErr() == nil || !strings.Contains(logs, "already unwrapped") {
		t.Fatalf("exit %v; want a failure naming the reused wrapping token:\n%s", bad.ExitErr(), logs)
	}
	if strings.Contains(logs, tok) {
		t.Error("the log carries the wrapping token")
	}
	if _, err := os.Stat(filepath.Join(e.Dir, "vault-wrap-stolen.sock")); err == nil {
		t.Error("the refused gateway opened its sandbox socket")
	}
	cb.Observef("fresh token: started, 200; reused token: exit %v, log names the reused token", bad.ExitErr())
}
