package main

import (
	"context"
	"crypto/ed25519"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/store"
)

// lastHead is the head of the log at path, read with the real verifier.
func lastHead(t *testing.T, path string) audit.Head {
	t.Helper()
	res, err := verifyAudit(path, true, 0, "")
	if err != nil || res.n == 0 {
		t.Fatalf("verify %s: %d records, %v", path, res.n, err)
	}
	return audit.Head{Seq: res.last, Hash: res.lastHash}
}

// cutLines keeps the first n lines of the log at path.
func cutLines(t *testing.T, path string, n int) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(data), "\n")
	if err := os.WriteFile(path, []byte(strings.Join(lines[:n], "")), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestAuditVerifyHead is THREATS G9 on the CLI: verify prints the head it
// reached, and a log cut at its end or rewritten with a recomputed chain
// (both verify on their own) fails --expect-head and --checkpoints.
func TestAuditVerifyHead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	writeAuditLog(t, path, 5)
	head := lastHead(t, path)
	key, err := audit.LoadCheckpointKey(filepath.Join(dir, "cp.key"), true)
	if err != nil {
		t.Fatal(err)
	}
	pub := hex.EncodeToString(key.Public().(ed25519.PublicKey))
	cps := filepath.Join(dir, "checkpoints.jsonl")
	if err := audit.AppendCheckpoint(cps, audit.NewCheckpoint(key, audit.Head{Seq: 2, Hash: strings.Repeat("0", 64)}, time.Now())); err != nil {
		t.Fatal(err)
	}
	if err := audit.AppendCheckpoint(cps, audit.NewCheckpoint(key, head, time.Now())); err != nil {
		t.Fatal(err)
	}
	cut := filepath.Join(dir, "cut.log")
	if err := os.WriteFile(cut, []byte(readFile(t, path)), 0o600); err != nil {
		t.Fatal(err)
	}
	cutLines(t, cut, 3) // the last two records deleted: the rest still verifies
	forged := filepath.Join(dir, "forged.log")
	writeAuditLog(t, forged, 6) // another run's records: same seqs, other hashes

	_, other, _ := ed25519.GenerateKey(nil)
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr bool
		want    []string
	}{
		{"head printed", []string{"--file", path}, false, []string{"ok: 5 records", "head: " + head.String()}},
		{"expected head held", []string{"--file", path, "--expect-head", head.String()}, false, []string{"ok: the log holds --expect-head " + head.String()}},
		{"truncated", []string{"--file", cut, "--expect-head", head.String()}, true, []string{"ok: 3 records", "FAIL: the log ends at seq 3, before seq 5", "deleted from its end"}},
		{"rewritten", []string{"--file", forged, "--expect-head", head.String()}, true, []string{"ok: 6 records", "FAIL: " + forged + ": the record at seq 5 has hash", "rewritten"}},
		{"bad expect-head", []string{"--file", path, "--expect-head", "5"}, true, nil},
		{"checkpoints hold", []string{"--file", path, "--checkpoints", cps, "--public-key", pub}, false, []string{"checkpoints: 2 signed by " + pub, "ok: the log holds the newest checkpoint " + head.String()}},
		{"checkpoints, truncated", []string{"--file", cut, "--checkpoints", cps, "--public-key", pub}, true, []string{"FAIL: the log ends at seq 3, before seq 5 of the newest checkpoint"}},
		{"checkpoints, rewritten", []string{"--file", forged, "--checkpoints", cps, "--public-key", pub}, true, []string{"the log was rewritten"}},
		{"checkpoints, another key", []string{"--file", path, "--checkpoints", cps, "--public-key", hex.EncodeToString(other.Public().(ed25519.PublicKey))}, true, []string{"FAIL: ", "not by the trusted key"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, _, err := cli(t, "", append([]string{"audit", "verify"}, tc.args...)...)
			if (err != nil) != tc.wantErr {
				t.Fatalf("err %v, want error %v; output %q", err, tc.wantErr, out)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("output %q lacks %q", out, w)
				}
			}
			if tc.name == "bad expect-head" && !strings.Contains(err.Error(), "--expect-head") {
				t.Errorf("err %v does not name --expect-head", err)
			}
		})
	}
}

// TestAuditAcceptHead: accept-head records the log's head as the one to
// continue, in the store and as a checkpoint, printing both heads.
func TestAuditAcceptHead(t *testing.T) {
	cfgPath := demoConfig(t)
	data, err := os.ReadFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(string(data), "audit:\n  path: audit.log\n", "audit:\n  path: audit.log\n  checkpoint:\n    path: checkpoints.jsonl\n", 1)
	if err := os.WriteFile(cfgPath, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(cfgPath)
	if err != nil || cfg.Audit.Checkpoint == nil {
		t.Fatalf("config: %v (checkpoint %v)", err, cfg.Audit.Checkpoint)
	}
	writeAuditLog(t, cfg.Audit.Path, 5)
	old := lastHead(t, cfg.Audit.Path)
	ctx := context.Background()
	st, err := store.Open(ctx, cfg.Store)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetAuditHead(ctx, old.Seq, old.Hash); err != nil {
		t.Fatal(err)
	}
	// While the store is open (a gateway running), nothing is accepted.
	if _, _, err := cli(t, "", "audit", "accept-head", "--config", cfgPath); err == nil || !strings.Contains(err.Error(), "in use") {
		t.Fatalf("accept-head beside an open store: %v", err)
	}
	st.Close()
	cutLines(t, cfg.Audit.Path, 3)
	now := lastHead(t, cfg.Audit.Path)
	out, _, err := cli(t, "", "audit", "accept-head", "--config", cfgPath)
	if err != nil || !strings.Contains(out, "accepted head "+now.String()) || !strings.Contains(out, "the store had "+old.String()) {
		t.Fatalf("accept-head: %v, output %q", err, out)
	}
	if st, err = store.Open(ctx, cfg.Store); err != nil {
		t.Fatal(err)
	}
	seq, hash, _, ok, err := st.AuditHead(ctx)
	st.Close()
	// The acceptance is the chain's next record, and its head the one the
	// store and the checkpoint hold.
	accepted := lastHead(t, cfg.Audit.Path)
	if err != nil || !ok || accepted.Seq != now.Seq+1 || (audit.Head{Seq: seq, Hash: hash}) != accepted {
		t.Fatalf("store head after accept = %d:%s (%v, %v), want %s", seq, hash, ok, err, accepted)
	}
	lines := strings.Split(strings.TrimSpace(readFile(t, cfg.Audit.Path)), "\n")
	if tail := lines[len(lines)-1]; !strings.Contains(tail, `"event":"`+audit.EventHeadAccepted+`"`) ||
		!strings.Contains(tail, `"accepted_head":"`+now.String()+`"`) || !strings.Contains(tail, `"previous_head":"`+old.String()+`"`) {
		t.Fatalf("last record %s: want %s naming both heads", tail, audit.EventHeadAccepted)
	}
	out, _, err = cli(t, "", "audit", "verify", "--config", cfgPath, "--checkpoints", cfg.Audit.Checkpoint.Path)
	if err != nil || !strings.Contains(out, "ok: the log holds the newest checkpoint "+accepted.String()) {
		t.Fatalf("verify against the accepted checkpoint: %v, output %q", err, out)
	}
	// A log that does not verify is never accepted.
	if err := os.WriteFile(cfg.Audit.Path, []byte(strings.Replace(readFile(t, cfg.Audit.Path), "allow", "block", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli(t, "", "audit", "accept-head", "--config", cfgPath); err == nil || !strings.Contains(err.Error(), "nothing accepted") {
		t.Fatalf("accept-head of a broken log: %v", err)
	}
}
