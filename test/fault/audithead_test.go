//go:build linux

package fault

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// TestAuditRewrittenOffline is THREATS G9 through the real binary. The
// gateway records its audit log's head in its store and in signed
// checkpoints (audit.checkpoint); with it stopped, someone with write access
// to the host deletes the last records, or rewrites the whole file with a
// recomputed chain (every hash and link right, so the chain alone verifies).
// The restart is refused with a message naming both heads, and `sluice
// audit verify` with --expect-head or --checkpoints fails on both files.
// The original file starts again, and `sluice audit accept-head` is the
// explicit way to continue a file that was cut on purpose.
func TestAuditRewrittenOffline(t *testing.T) {
	eachStore(t, func(t *testing.T, sk storeKind) {
		e := newEnv(t)
		d := e.BaseConfig("rewrite")
		sk.apply(d)
		cps := filepath.Join(e.Dir, "rewrite-checkpoints.jsonl")
		d["audit"].(map[string]any)["checkpoint"] = map[string]any{"path": cps, "interval": "1s"}
		path := e.Write(d)
		g := e.Start(d, path)
		for range 3 {
			if r := g.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
				t.Fatalf("control call: %d %s", r.Status, r.Body)
			}
		}
		g.Stop() // a clean stop records the final head and checkpoint
		if err := g.ExitErr(); err != nil {
			t.Fatalf("gateway stop: %v\n%s", err, g.Stderr())
		}
		orig, err := os.ReadFile(g.Audit)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.SplitAfter(strings.TrimSuffix(string(orig), "\n"), "\n")
		var last audit.Record
		if err := json.Unmarshal([]byte(lines[len(lines)-1]), &last); err != nil {
			t.Fatal(err)
		}
		head := audit.Head{Seq: last.Seq, Hash: last.Hash}
		if head.Seq < 6 {
			t.Fatalf("log has %d records after 3 calls, want at least 6", head.Seq)
		}
		out, err := e.CLI("", "audit", "verify", "--config", path, "--checkpoints", cps)
		if err != nil || !strings.Contains(out, "head: "+head.String()) || !strings.Contains(out, "ok: the log holds the newest checkpoint "+head.String()) {
			t.Fatalf("verify of the intact log: %v\n%s", err, out)
		}

		cut := strings.Join(lines[:len(lines)-2], "")
		forged := forgeLog(t, lines)
		for _, tc := range []struct {
			name, kind string
			file       string
			want       string
		}{
			{"the last two records deleted", "truncated", cut, "ends at seq " + strconv.FormatUint(head.Seq-2, 10) + ", before the recorded seq " + strconv.FormatUint(head.Seq, 10)},
			{"rewritten with a recomputed chain (a field added to every record)", "rewritten", forged, "has another record at seq " + strconv.FormatUint(head.Seq, 10)},
		} {
			t.Run(tc.kind, func(t *testing.T) {
				c := casebook.Expect(t, "G9", sk.threat("audit log "+tc.name+" while the gateway is stopped, then restart and `audit verify`"),
					"restart refused naming the recorded and the file's head; the chain alone verifies, --expect-head and --checkpoints fail")
				if err := os.WriteFile(g.Audit, []byte(tc.file), 0o600); err != nil {
					t.Fatal(err)
				}
				chain, cerr := e.CLI("", "audit", "verify", "--config", path)
				exp, xerr := e.CLI("", "audit", "verify", "--config", path, "--expect-head", head.String())
				cpo, perr := e.CLI("", "audit", "verify", "--config", path, "--checkpoints", cps)
				g2 := e.Launch(d, path)
				select {
				case <-g2.Exited():
				case <-time.After(60 * time.Second):
					t.Fatalf("the gateway started on a %s log\n%s", tc.kind, g2.Stderr())
				}
				stderr := string(g2.Stderr())
				_, sockErr := os.Stat(g2.Sock)
				c.Observef("restart: exit %v, socket %v, log %q; verify alone: %v; --expect-head: %v %q; --checkpoints: %v %q",
					g2.ExitErr(), sockErr, firstLine(stderr, "audit.path"), cerr, xerr, firstLine(exp, "FAIL"), perr, firstLine(cpo, "FAIL"))
				var ee *exec.ExitError
				if !errors.As(g2.ExitErr(), &ee) || !strings.Contains(stderr, tc.want) || !strings.Contains(stderr, tc.kind) ||
					!strings.Contains(stderr, "recorded head "+head.String()) || !strings.Contains(stderr, "file's head ") || !strings.Contains(stderr, "sluice audit accept-head") {
					t.Errorf("restart on a %s log: exit %v, want a refusal naming %q, both heads and accept-head; stderr:\n%s", tc.kind, g2.ExitErr(), tc.want, stderr)
				}
				if !errors.Is(sockErr, os.ErrNotExist) {
					t.Errorf("the refused gateway left its sandbox socket: %v", sockErr)
				}
				if cerr != nil || !strings.Contains(chain, "chain intact") {
					t.Errorf("the %s log should verify on its own (that is why a head is kept elsewhere): %v\n%s", tc.kind, cerr, chain)
				}
				if xerr == nil || !strings.Contains(exp, "FAIL: ") {
					t.Errorf("--expect-head %s passed on a %s log:\n%s", head, tc.kind, exp)
				}
				if perr == nil || !strings.Contains(cpo, "FAIL: ") || !strings.Contains(cpo, "checkpoints: ") {
					t.Errorf("--checkpoints passed on a %s log:\n%s", tc.kind, cpo)
				}
			})
		}

		// Control: the original file starts again.
		if err := os.WriteFile(g.Audit, orig, 0o600); err != nil {
			t.Fatal(err)
		}
		g3 := e.Start(d, path)
		if r := g3.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
			t.Fatalf("call on the restored log: %d %s", r.Status, r.Body)
		}
		g3.Stop()
		// A cut the operator accepts: accept-head prints both heads, the
		// gateway starts, and the checkpoints verify against the accepted head.
		now, _ := os.ReadFile(g.Audit)
		nl := strings.SplitAfter(strings.TrimSuffix(string(now), "\n"), "\n")
		if err := os.WriteFile(g.Audit, []byte(strings.Join(nl[:len(nl)-1], "")), 0o600); err != nil {
			t.Fatal(err)
		}
		acc, err := e.CLI("", "audit", "accept-head", "--config", path)
		if err != nil || !strings.Contains(acc, "accepted head ") || !strings.Contains(acc, "the store had ") {
			t.Fatalf("accept-head: %v\n%s", err, acc)
		}
		if tail := g.AuditRecords(); len(tail) == 0 || tail[len(tail)-1]["event"] != audit.EventHeadAccepted {
			t.Fatalf("after accept-head the log does not end with %s: %v", audit.EventHeadAccepted, tail)
		}
		g4 := e.Start(d, path)
		if r := g4.Call(agentA, "tickets.list_tickets", `{}`); r.Status != http.StatusOK {
			t.Fatalf("call after accept-head: %d %s", r.Status, r.Body)
		}
		g4.Stop()
		if out, err := e.CLI("", "audit", "verify", "--config", path, "--checkpoints", cps); err != nil {
			t.Fatalf("verify after accept-head: %v\n%s", err, out)
		}
	})
}

// forgeLog writes the records of lines again, each with one field added,
// with the real writer: a recomputed chain as long as the original, every
// hash and link right. It returns the new file's text.
func forgeLog(t *testing.T, lines []string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "forged.log")
	l, err := audit.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range lines {
		var r audit.Record
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatal(err)
		}
		if r.Fields == nil {
			r.Fields = map[string]any{}
		}
		r.Fields["note"] = "forged"
		if _, err := l.Append(context.Background(), audit.Record{RequestID: r.RequestID, Event: r.Event, Fields: r.Fields}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// firstLine is the first line of s containing sub ("" if none).
func firstLine(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			return l
		}
	}
	return ""
}
