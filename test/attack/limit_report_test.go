//go:build linux

package attack

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestLimitKillReachesGatewayAudit (B2): sandboxd runs with gateway_admin
// and a session token, against a real gateway whose TLS interception is
// off. A memory bomb in a real sandbox is OOM-killed inside its cgroup
// (exit 137, killed_by=oom), and the kill reaches the gateway's
// hash-chained audit log as sandbox_oom for that sandbox, agent and
// session, with the 64 MiB limit and who reported it; the chain verifies.
func TestLimitKillReachesGatewayAudit(t *testing.T) {
	need(t)
	st := stateDir(t)
	e, g, cfgPath, tokenFile := reportingGateway(t, "b2", st)
	c := casebook.Expect(t, "B2", "memory bomb under --memory 64MiB, sandboxd reporting to the gateway (gateway_admin)",
		"exit 137 killed_by=oom; gateway audit record sandbox_oom with the sandbox, agent, session, limit 67108864 and reported_by session_token[0]; the chain verifies")

	sbx := filepath.Join(st, "sandboxd.yaml")
	y := fmt.Sprintf("state_dir: %s\ngateway: %s\nhost: node-b2\ngateway_admin: http://%s\ngateway_session_token_file: %s\n",
		filepath.Join(st, "state"), g.Sock, g.Admin, tokenFile)
	if err := os.WriteFile(sbx, []byte(y), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// sandboxd joins the namespace where the gateway's admin listener is
	// (nsenter joins only the network namespace: ip netns exec would also
	// remount /sys, hiding the cgroup hierarchies).
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+e.NS.Name, bin, "run", "--config", sbx,
		"--agent", "agent-a", "--session", "s-b2", "--user", "alice", "--memory", strconv.Itoa(64<<20),
		"--copy", hostile+":/workspace/hostile", "--", "/workspace/hostile", "membomb")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 137 || !strings.Contains(errb.String(), "killed_by=oom") {
		t.Fatalf("sandboxd run: %v, stderr %q; want exit 137 and killed_by=oom", err, errb.String())
	}
	rec := g.AwaitAudit("sandbox_oom", `"s-b2"`)
	f, _ := rec["fields"].(map[string]any)
	c.Observef("exit 137 killed_by=oom; audit %v %v", rec["event"], f)
	sandbox, _ := f["sandbox"].(string)
	if f["agent"] != "agent-a" || f["session"] != "s-b2" || f["user"] != "alice" || f["host"] != "node-b2" ||
		f["limit"] != float64(64<<20) || f["reported_by"] != "session_token[0]" || sandbox == "" {
		t.Errorf("sandbox_oom fields %v", f)
	}
	evs := events(t, filepath.Join(st, "state"))
	if !hasEvent(evs, "oom") || hasEvent(evs, "gateway_report_failed") || hasEvent(evs, "gateway_report_dropped") {
		t.Errorf("sandboxd events %v: want oom and no failed report", evs)
	}
	if out, err := e.CLI("", "audit", "verify", "--config", cfgPath); err != nil {
		t.Errorf("sluice audit verify: %v: %s", err, out)
	}
}

// reportingGateway starts a real gateway in a namespace of its own that
// takes one session token (session_token[0]), which it writes to a file
// under st for sandboxd's gateway_session_token_file.
func reportingGateway(t *testing.T, stem, st string) (e *gwenv.Env, g *gwenv.Gateway, cfgPath, tokenFile string) {
	t.Helper()
	e = gwenv.New(t, gatewayBin(t))
	token := "tok-sandboxd-" + stem
	sum := sha256.Sum256([]byte(token))
	d := e.CoreConfig(stem)
	d.Gateway()["session_tokens_sha256"] = []string{hex.EncodeToString(sum[:])}
	// The sandboxes' agent, granted nothing: sandboxd run refuses an agent
	// the gateway answers unknown_agent for.
	d["agents"] = []map[string]any{{"name": "agent-a", "connectors": []string{}}}
	cfgPath = e.Write(d)
	g = e.Start(d, cfgPath)
	tokenFile = filepath.Join(st, "session.token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return e, g, cfgPath, tokenFile
}
