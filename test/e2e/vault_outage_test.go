//go:build linux

package e2e

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/vault/api"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// leaseTTL is the default_ttl and max_ttl of the short database role the
// dynamic-lease outage uses: long enough for a call and an outage inside
// it, short enough to wait out.
const leaseTTL = 8 * time.Second

// auditedCode reports whether the gateway's audit log holds, or within
// a few seconds comes to hold, a record for request rid whose fields
// carry code.
func auditedCode(g *gwenv.Gateway, rid, code string) bool {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		for _, rec := range g.AuditRecords() {
			if rec["request_id"] != rid {
				continue
			}
			if f, _ := rec["fields"].(map[string]any); f != nil && f["code"] == code {
				return true
			}
		}
		if time.Now().After(deadline) {
			return false
		}
	}
}

// expectCredentialUnavailable checks the G3 refusal: 503
// credential_unavailable, no upstream connection since before, a body
// that names neither Vault nor its address, and the audit record.
func expectCredentialUnavailable(t *testing.T, e *gwenv.Env, g *gwenv.Gateway, w *vaultWorld, r gwenv.Reply, before int64) (audited bool) {
	t.Helper()
	expect(t, r, http.StatusServiceUnavailable, "credential_unavailable")
	if got := e.Up.Accepts.Load(); got != before {
		t.Errorf("the upstream got %d connections for a call refused for its credential", got-before)
	}
	if strings.Contains(strings.ToLower(string(r.Body)), "vault") || strings.Contains(string(r.Body), w.srv.Addr) {
		t.Errorf("the refusal carries Vault's error: %s", r.Body)
	}
	audited = auditedCode(g, r.RequestID, "credential_unavailable")
	if !audited {
		t.Errorf("no audit record with code credential_unavailable for %s", r.RequestID)
	}
	return audited
}

// refusalReason is the reason of the gateway's tool_call log line for
// request rid (the operator's view: it names Vault's answer). The line may
// be written just after the reply: it is awaited.
func refusalReason(g *gwenv.Gateway, rid string) string {
	m := g.AwaitLog("tool_call "+rid, func(m map[string]any) bool { return m["msg"] == "tool_call" && m["request_id"] == rid })
	r, _ := m["reason"].(string)
	return r
}

// lastKey is the X-Api-Key of the upstream's latest request, after n
// earlier ones; it fails t unless exactly one more arrived.
func lastKey(t *testing.T, e *gwenv.Env, n int) string {
	t.Helper()
	reqs := e.Up.Requests()
	if len(reqs) != n+1 {
		t.Fatalf("upstream saw %d new requests, want 1", len(reqs)-n)
	}
	return reqs[n].Header.Get("X-Api-Key")
}

// TestVaultDynamicLeaseOutage: a dynamic PostgreSQL credential leased for
// leaseTTL (max_ttl too, so it cannot be renewed past it) keeps serving
// from the gateway's lease table while Vault is stopped or sealed, as
// vault/leases.go designs it (the lease is valid: Vault does not need to
// be asked); it is not handed out in its last renewMargin (2s) and never
// after its end: then every call is 503 credential_unavailable with
// nothing dialled, no Vault text in the body and the refusal audited
// (G3). Control: the database's own end for the role (VALID UNTIL) is the
// lease's, so the role's short ttl really applied.
func TestVaultDynamicLeaseOutage(t *testing.T) {
	for _, tc := range []struct{ how, why string }{
		// why: what the gateway's log line says Vault answered.
		{"stopped", "unreachable"},
		{"sealed", "status 503"},
	} {
		how := tc.how
		t.Run(how, func(t *testing.T) {
			cb := casebook.Expect(t, "G3", "Vault "+how+" while a session holds a dynamic database lease (ttl and max_ttl "+leaseTTL.String()+")",
				"the same leased credential serves until 2s before the lease ends (renew margin), then 503 credential_unavailable, no upstream connection, audited; never a credential past its lease")
			e := newEnv(t)
			w := newVaultWorld(t, e, true)
			w.srv.Write(t, "database/roles/ro", map[string]any{
				"db_name":             "pg",
				"creation_statements": `CREATE ROLE "{{name}}" WITH LOGIN PASSWORD '{{password}}' VALID UNTIL '{{expiration}}';`,
				"default_ttl":         leaseTTL.String(), "max_ttl": leaseTTL.String(),
			})
			d := vaultConfig(e, w, "vault-lease-"+how, "3s",
				[]map[string]any{{"slug": "tickets", "credential": map[string]any{"vault": map[string]any{"dynamic": "database/creds/ro"}}}}, "tok-sandboxd", nil)
			g := e.Start(d, e.Write(d))

			callStart := time.Now()
			expect(t, g.Call(agentA, "tickets.list_tickets", `{}`), http.StatusOK, "")
			// Vault issued the lease inside [callStart, leased]: it ends
			// inside [callStart+ttl, leased+ttl].
			leased := time.Now()
			key := lastKey(t, e, 0)
			user, pass, ok := strings.Cut(key, ":")
			if !ok || !strings.HasPrefix(user, "v-") {
				t.Fatal("the upstream did not get a Vault-made user:password")
			}
			if _, err := w.pg.Query(t.Context(), user, pass, "select 1"); err != nil {
				t.Fatalf("the leased credential does not log in: %v", err)
			}
			switch how {
			case "stopped":
				w.srv.Stop()
			default:
				w.srv.Seal(t)
			}

			// Within the lease: the gateway serves the credential it holds.
			// The gateway ends the lease at the earliest callStart+ttl and
			// hands it out until 2s before that: the call must start in time.
			during := time.Since(callStart)
			if during >= leaseTTL-2500*time.Millisecond {
				t.Fatalf("the outage call came %v after the lease was asked for: too late to test serving within it", during)
			}
			r := g.Call(agentA, "tickets.list_tickets", `{}`)
			expect(t, r, http.StatusOK, "")
			if got := lastKey(t, e, 1); got != key {
				t.Error("during the outage the upstream got a credential other than the lease the gateway held")
			}

			// One second before the latest possible end, inside the
			// lease's last 2s: refused (vault/leases.go renewMargin: a call
			// might outlive it), though Vault's lease may still run.
			time.Sleep(time.Until(leased.Add(leaseTTL - time.Second)))
			before := e.Up.Accepts.Load()
			margin := g.Call(agentA, "tickets.list_tickets", `{}`)
			marginAt := time.Since(callStart)
			expectCredentialUnavailable(t, e, g, w, margin, before)

			// Past the end: refused, nothing dialled, audited.
			time.Sleep(time.Until(leased.Add(leaseTTL + 500*time.Millisecond)))
			before = e.Up.Accepts.Load()
			r = g.Call(agentA, "tickets.list_tickets", `{}`)
			audited := expectCredentialUnavailable(t, e, g, w, r, before)
			why := refusalReason(g, r.RequestID)
			if !strings.HasPrefix(why, "credential_unavailable: ") || !strings.Contains(why, tc.why) {
				t.Errorf("the refusal's log reason is %q, want credential_unavailable naming Vault's %q", why, tc.why)
			}
			if n := len(e.Up.Requests()); n != 2 {
				t.Errorf("the upstream saw %d requests, want 2 (before and during the outage)", n)
			}
			// Control: the role's ttl applied. PostgreSQL's VALID UNTIL is
			// the lease's end plus the 5s Vault's database engine adds so
			// that the database never ends a credential before its lease.
			epoch, err := strconv.ParseFloat(w.pg.Super(t, "select extract(epoch from rolvaliduntil) from pg_roles where rolname = '"+user+"'"), 64)
			if err != nil {
				t.Fatalf("the leased role's VALID UNTIL: %v", err)
			}
			validUntil := time.Unix(0, int64(epoch*1e9))
			if validUntil.Before(callStart.Add(leaseTTL)) || validUntil.After(leased.Add(leaseTTL+6*time.Second)) {
				t.Errorf("the leased role is valid until %v, want within [%v, %v]: the role's ttl did not apply", validUntil, callStart.Add(leaseTTL), leased.Add(leaseTTL+6*time.Second))
			}
			cb.Observef("within the lease (+%v) 200 with the same lease; at +%v (last 2s) %d %s; after the end %d %s (%s), %d upstream connections, audited=%v; the database ends the role %v after the call",
				during.Round(100*time.Millisecond), marginAt.Round(100*time.Millisecond), margin.Status, margin.Code, r.Status, r.Code, why, e.Up.Accepts.Load()-before, audited, validUntil.Sub(callStart).Round(100*time.Millisecond))
		})
	}
}

// TestVaultFileAuditFull: Vault's only audit device is a file on a small
// tmpfs. Once the disk is full Vault refuses requests it cannot log, and
// the gateway, its KV cache expired, answers 503 credential_unavailable
// with nothing dialled and the refusal audited (G4, handled as G3); with
// the space back, calls succeed again.
func TestVaultFileAuditFull(t *testing.T) {
	cb := casebook.Expect(t, "G4", "Vault's only audit device is a file on a 256k tmpfs that fills up (KV credential, cache_ttl 1s)",
		"Vault refuses what it cannot log; the gateway answers 503 credential_unavailable, no upstream connection, audited; space back: 200 again")
	e := newEnv(t)
	w := newVaultWorld(t, e, false)
	fs := gwenv.Tmpfs(t, e.Dir, "vaultaudit", "256k")
	auditFile := filepath.Join(fs, "audit.log")
	root := w.srv.Client(t)
	if err := root.Sys().EnableAuditWithOptions("file", &api.EnableAuditOptions{Type: "file", Options: map[string]string{"file_path": auditFile}}); err != nil {
		t.Fatalf("enable file audit: %v", err)
	}
	d := vaultConfig(e, w, "vault-auditfull", "1s",
		[]map[string]any{{"slug": "tickets", "credential": map[string]any{"vault": map[string]any{"kv": "secret/data/tickets", "field": "api_key"}}}}, "tok-sandboxd", nil)
	g := e.Start(d, e.Write(d))
	expect(t, g.Call(agentA, "tickets.list_tickets", `{}`), http.StatusOK, "")
	if got := lastKey(t, e, 0); got != e.Secret {
		t.Fatal("the upstream did not receive the Vault KV value")
	}
	if fi, err := os.Stat(auditFile); err != nil || fi.Size() == 0 {
		t.Fatalf("Vault wrote nothing to its file audit device (%v): the control did not exercise it", err)
	}

	filler := gwenv.Fill(t, fs)
	// tmpfs allocates pages: the audit file's last page may still take an
	// entry or two. Ask Vault directly until it refuses.
	var vaultErr error
	var tries int
	for tries = 1; tries <= 200; tries++ {
		if _, vaultErr = root.Logical().Read("secret/data/tickets"); vaultErr != nil {
			break
		}
	}
	var re *api.ResponseError
	if !errors.As(vaultErr, &re) {
		t.Fatalf("Vault kept serving with its only audit device on a full disk (%d reads); last error %v", tries-1, vaultErr)
	}
	t.Logf("Vault's answer after %d reads on a full audit disk: %d %v", tries, re.StatusCode, re.Errors)

	time.Sleep(1500 * time.Millisecond) // past cache_ttl
	n := len(e.Up.Requests())
	before := e.Up.Accepts.Load()
	r := g.Call(agentA, "tickets.list_tickets", `{}`)
	audited := expectCredentialUnavailable(t, e, g, w, r, before)
	dialled := e.Up.Accepts.Load() - before
	why := refusalReason(g, r.RequestID)
	if !strings.HasPrefix(why, "credential_unavailable: ") || !strings.Contains(why, fmt.Sprintf("status %d", re.StatusCode)) {
		t.Errorf("the refusal's log reason is %q, want credential_unavailable naming Vault's status %d", why, re.StatusCode)
	}
	if got := len(e.Up.Requests()); got != n {
		t.Errorf("the upstream saw %d requests during the audit failure", got-n)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var back gwenv.Reply
	deadline := time.Now().Add(15 * time.Second)
	for {
		back = g.Call(agentA, "tickets.list_tickets", `{}`)
		if back.Status == http.StatusOK || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	expect(t, back, http.StatusOK, "")
	if got := e.Up.Requests(); got[len(got)-1].Header.Get("X-Api-Key") != e.Secret {
		t.Error("after recovery the upstream did not receive the Vault KV value")
	}
	cb.Observef("full disk: Vault %d %q after %d reads; gateway %d %s (%s), %d upstream connections, audited=%v; space freed: %d",
		re.StatusCode, strings.Join(re.Errors, "; "), tries, r.Status, r.Code, why, dialled, audited, back.Status)
}

// runSandboxWith is runInSandbox with several files copied in
// ("HOSTPATH:/workspace/PATH" each) and environment variables set
// ("KEY=VALUE" each): sandboxd run for agent-a, session,
// the gateway at sock, /bin/sh -c script; it returns stdout.
func runSandboxWith(t *testing.T, sock, session string, copies, envs []string, script string, limit time.Duration) *bytes.Buffer {
	t.Helper()
	state := sandboxState(t, "sluice-e2e-"+session+"-")
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	args := []string{"run", "--config", execTimeoutConfig(t, limit*5/6), "--state-dir", state, "--gateway", sock, "--agent", "agent-a", "--session", session}
	for _, c := range copies {
		args = append(args, "--copy", c)
	}
	for _, kv := range envs {
		args = append(args, "--env", kv)
	}
	args = append(args, "--timeout", (limit * 5 / 6).String(), "--", "/bin/sh", "-c", script)
	cmd := exec.CommandContext(ctx, sandboxdBin, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("sandboxd run: %v\nstdout: %s\nstderr: %s", err, out.String(), errb.String())
	}
	return &out
}

// sandboxDump is the script that prints everything a sandbox can read
// outside the host's read-only system directories: its environment (as
// the shell sees it and as /proc has it, for every process it can see),
// command lines, mounts, and every regular file under / except /usr,
// /proc, /sys, /dev (and the merged-/usr links), each after a "=== file
// NAME" header. Files in the sandbox's own places (/workspace, /tmp,
// /run, /.sluice, /root, /home, /var/tmp) are printed whatever they hold;
// elsewhere (the host's read-only binds such as /etc and /opt) text files
// are printed and binaries only listed ("=== binary NAME SIZE"). Then the
// agent's calls through the gateway (tcp and the unix socket, both
// connectors), whose replies are part of what the sandbox reads. The
// whole is gzipped and base64ed: sandboxd caps a run's output at 1 MiB.
// /opt/sluice-test (the npm packages test.sh installs for the MCP client
// tests: public, pinned, 29 MB of JavaScript) is listed, not printed: it
// would fill the cap, and nothing of the gateway's is written there.
const sandboxDump = `
sec() { printf '\n=== %s\n' "$1"; }
dump() {
sec env; env
sec /proc/self/environ; tr '\0' '\n' </proc/self/environ
sec /proc/self/cmdline; tr '\0' ' ' </proc/self/cmdline
for p in /proc/[0-9]*; do
  sec "$p/environ"; tr '\0' '\n' <"$p/environ"
  sec "$p/cmdline"; tr '\0' ' ' <"$p/cmdline"
done
sec mounts; cat /proc/self/mountinfo
sec ls; ls -la /run/sluice /workspace /tmp /etc
sec "listed only: /opt/sluice-test"; find /opt/sluice-test -maxdepth 2 2>/dev/null
find / \( -path /usr -o -path /proc -o -path /sys -o -path /dev -o -path /bin -o -path /sbin -o -path /lib -o -path /lib32 -o -path /lib64 -o -path /libx32 -o -path /opt/sluice-test \) -prune -o -type f -print 2>/dev/null | while read -r f; do
  case "$f" in /workspace/agent) continue;; esac
  if [ ! -r "$f" ]; then sec "unreadable $f"; continue; fi
  case "$f" in
  /workspace/*|/tmp/*|/run/*|/.sluice/*|/root/*|/home/*|/var/tmp/*) sec "file $f"; cat "$f"; continue;;
  esac
  if [ ! -s "$f" ] || grep -qI . "$f"; then sec "file $f"; head -c 262144 "$f"; else sec "binary $f $(wc -c <"$f")"; fi
done
sec calls; /workspace/agent db.list_tickets 127.0.0.1:9; /workspace/agent tickets.list_tickets 127.0.0.1:9
sec end
}
dump 2>&1 | gzip -c | base64
`

// unpackDump reverses the script's gzip and base64.
func unpackDump(t *testing.T, out []byte) string {
	t.Helper()
	z, err := base64.StdEncoding.DecodeString(strings.Join(strings.Fields(string(out)), ""))
	if err != nil {
		t.Fatalf("sandbox dump: base64: %v: %s", err, tailOf(string(out), 2000))
	}
	zr, err := gzip.NewReader(bytes.NewReader(z))
	if err != nil {
		t.Fatalf("sandbox dump: gzip: %v", err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("sandbox dump: gunzip: %v", err)
	}
	return string(b)
}

// TestVaultCredentialsNotInSandbox: with the gateway holding Vault
// credentials in use (a KV value and dynamic PostgreSQL leases, one made
// for a call from inside the sandbox itself), a real sandbox made by
// sandboxd dumps everything it can read that is not the host's read-only
// system: environments, command lines, /run/sluice, /workspace, /tmp, /etc
// and every other file, and the replies of its calls. None of the Vault
// credentials the test knows (root token, the gateway's role_id and
// secret_id, the KV value, the leases' users and passwords, the database
// superuser password) nor any Vault token prefix is in it (D1). Controls:
// a marker the test put in /workspace and one it put in the command's
// environment are both found, so a scan that reads nothing cannot pass.
func TestVaultCredentialsNotInSandbox(t *testing.T) {
	cb := casebook.Expect(t, "D1", "agent code in a real sandbox (sandboxd) dumps its environment, /proc/*/environ and cmdline, /run/sluice, /workspace, /tmp, every other non-/usr text file (host binaries only listed), and the replies of its own calls, while the gateway holds Vault credentials (KV value and dynamic PostgreSQL leases)",
		"no Vault token, role_id, secret_id, KV value or leased database user/password in anything the sandbox reads; the markers planted in /workspace and in the environment are found")
	e := newEnv(t)
	if _, err := os.Stat("/proc/self/ns/user"); err != nil {
		t.Skip("kernel lacks user namespaces")
	}
	buildSandboxBins(t)
	w := newVaultWorld(t, e, true)
	d := vaultConfig(e, w, "vault-d1", "60s", []map[string]any{
		{"slug": "tickets", "credential": map[string]any{"vault": map[string]any{"kv": "secret/data/tickets", "field": "api_key"}}},
		{"slug": "db", "credential": map[string]any{"vault": map[string]any{"dynamic": "database/creds/ro"}}},
	}, "tok-sandboxd", nil)
	g := e.Start(d, e.Write(d))
	// The credentials are in use before the sandbox starts.
	expect(t, g.Call(agentA, "tickets.list_tickets", `{}`), http.StatusOK, "")
	expect(t, g.Call(agentA, "db.list_tickets", `{}`), http.StatusOK, "")

	b := make([]byte, 16)
	_, _ = rand.Read(b)
	marker := "d1-marker-" + hex.EncodeToString(b)
	markerFile := filepath.Join(e.Dir, "marker.txt")
	if err := os.WriteFile(markerFile, []byte(marker+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const session = "d1-sbx"
	_, _ = rand.Read(b)
	envMarker := "d1-env-" + hex.EncodeToString(b)
	out := runSandboxWith(t, g.Sock, session, []string{agentBin + ":/workspace/agent", markerFile + ":/workspace/marker.txt"},
		[]string{"D1_MARKER=" + envMarker}, sandboxDump, 120*time.Second)
	dump := unpackDump(t, out.Bytes())
	e.Keep([]byte(dump))

	// The calls from inside reached the upstream with the credentials
	// attached (so a lease for the sandbox's own session exists).
	calls := section(dump, "=== calls")
	if !strings.Contains(calls, "tcp ") || !strings.Contains(calls, "unix ") {
		t.Fatalf("the sandbox did not finish its dump and calls:\n%s", tailOf(dump, 4000))
	}
	ok := 0
	for _, l := range strings.Split(calls, "\n") {
		switch {
		case strings.HasPrefix(l, "tcp 200 ") || strings.HasPrefix(l, "unix 200 "):
			ok++
		case strings.HasPrefix(l, "tcp ") || strings.HasPrefix(l, "unix "):
			t.Errorf("a call from inside the sandbox failed: %q", l)
		}
	}
	if ok != 4 {
		t.Errorf("%d calls from inside the sandbox answered 200, want 4 (tcp and unix, both connectors)", ok)
	}
	secrets := map[string]string{"root token": w.srv.RootToken, "postgres superuser password": w.pg.Password, "KV value": e.Secret}
	for name, f := range map[string]string{"role_id": w.rid, "secret_id": w.sid} {
		v, err := os.ReadFile(f)
		if err != nil || len(v) == 0 {
			t.Fatalf("%s: %v", name, err)
		}
		secrets[name] = string(v)
	}
	for i, r := range e.Up.Requests() {
		k := r.Header.Get("X-Api-Key")
		if u, p, ok := strings.Cut(k, ":"); ok {
			secrets[fmt.Sprintf("lease user #%d", i)] = u
			secrets[fmt.Sprintf("lease password #%d", i)] = p
		}
	}
	// Two host calls, four from inside (tcp and unix, both connectors).
	if n := len(e.Up.Requests()); n != 6 {
		t.Errorf("the upstream saw %d requests, want 6 (2 from the host, 4 from inside)", n)
	}
	leases := distinctLeaseUsers(secrets)
	if leases < 2 {
		t.Errorf("%d distinct leased users, want 2 (the host's session and the sandbox's)", leases)
	}
	hits := 0
	for name, s := range secrets {
		if strings.Contains(dump, s) {
			hits++
			t.Errorf("D1: the sandbox can read the %s", name)
		}
	}
	for _, prefix := range []string{"hvs.", "hvb.", "hvr."} { // any Vault token: the gateway's own included
		if strings.Contains(dump, prefix) {
			hits++
			t.Errorf("D1: the sandbox can read something shaped like a Vault token (%s...)", prefix)
		}
	}
	// Controls: the scan read the environment and the workspace.
	files, binaries := strings.Count(dump, "\n=== file "), strings.Count(dump, "\n=== binary ")
	if !strings.Contains(dump, "=== file /workspace/marker.txt\n"+marker) {
		t.Error("control: the planted /workspace marker is not in the dump: the scan reads nothing")
	}
	if !strings.Contains(section(dump, "=== env"), "D1_MARKER="+envMarker) || !strings.Contains(section(dump, "=== /proc/self/environ"), "D1_MARKER="+envMarker) {
		t.Error("control: the environment marker given to sandboxd run is not in the dumped env and /proc/self/environ")
	}
	for _, dir := range []string{"/run/sluice", "/workspace", "/tmp", "/etc"} {
		if !strings.Contains(dump, dir) {
			t.Errorf("control: the dump does not list %s", dir)
		}
	}
	t.Logf("dump: %d bytes, %d files, %d binaries listed; listing:\n%s", len(dump), files, binaries, fileList(dump))
	cb.Observef("%d bytes dumped (%d files read, %d host binaries listed, every /proc environ and cmdline, 4 calls from inside), %d secret values searched (%d leases: users and passwords) and 3 token prefixes: %d hits; file and env markers found: %v",
		len(dump), files, binaries, len(secrets), leases, hits, strings.Contains(dump, marker) && strings.Contains(dump, envMarker))
}

// distinctLeaseUsers counts the distinct leased database users in secrets.
func distinctLeaseUsers(secrets map[string]string) int {
	seen := map[string]bool{}
	for name, v := range secrets {
		if strings.HasPrefix(name, "lease user") {
			seen[v] = true
		}
	}
	return len(seen)
}

// fileList is the file headers of a dump, one a line, but for the text
// files of the host's /etc and /opt (too many to list).
func fileList(dump string) string {
	var b strings.Builder
	for _, l := range strings.Split(dump, "\n") {
		if strings.HasPrefix(l, "=== file /etc/") || strings.HasPrefix(l, "=== file /opt/") {
			continue
		}
		if strings.HasPrefix(l, "=== file ") || strings.HasPrefix(l, "=== binary ") || strings.HasPrefix(l, "=== unreadable ") {
			b.WriteString(strings.TrimPrefix(l, "=== ") + "\n")
		}
	}
	return b.String()
}

// section is dump from the last line starting with header on ("" if none).
func section(dump, header string) string {
	i := strings.LastIndex(dump, "\n"+header)
	if i < 0 {
		return ""
	}
	return dump[i+1:]
}

// tailOf is the last n bytes of s.
func tailOf(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}
