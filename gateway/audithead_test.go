package gateway

import (
	"context"
	"crypto/ed25519"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/store"
)

// TestAuditHeadRecorded (THREATS G9): a running gateway records its log's
// head in the store and in signed checkpoints at the interval, and a clean
// stop records the final one; a log then cut by one record is refused at
// the next New, naming both heads.
func TestAuditHeadRecorded(t *testing.T) {
	up := newUpstream(t)
	var cps string
	g := startGateway(t, up.URL, "", func(c *config.Config) {
		cps = filepath.Join(filepath.Dir(c.Audit.Path), "checkpoints.jsonl")
		c.Audit.Checkpoint = &config.AuditCheckpoint{Path: cps, Interval: config.Duration(time.Second),
			KeyFile: filepath.Join(filepath.Dir(c.Audit.Path), "cp.key")}
	})
	if r := doCall(t, g.client(agentA), "tickets.list_tickets", `{}`); r.status != 200 {
		t.Fatalf("call: %d %s", r.status, r.raw)
	}
	want := g.audit.Head()
	key, err := audit.LoadCheckpointKey(g.cfg.Audit.Checkpoint.KeyFile, false)
	if err != nil {
		t.Fatal(err)
	}
	pub := key.Public().(ed25519.PublicKey)
	deadline := time.Now().Add(10 * time.Second)
	for {
		newest, _, err := audit.ReadCheckpoints(cps, pub)
		seq, hash, _, ok, serr := g.store.AuditHead(context.Background())
		if err == nil && newest.Head() == want && serr == nil && ok && (audit.Head{Seq: seq, Hash: hash}) == want {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10s: newest checkpoint %v (%v), store head %d:%s (%v %v); want %s", newest.Head(), err, seq, hash, ok, serr, want)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// A clean stop, then the last record is cut.
	g.cancel()
	if err := <-g.done; err != nil {
		t.Fatal(err)
	}
	g.done <- nil // for the cleanup
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(g.cfg.Audit.Path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(strings.TrimSuffix(string(data), "\n"), "\n")
	if err := os.WriteFile(g.cfg.Audit.Path, []byte(strings.Join(lines[:len(lines)-1], "")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = New(context.Background(), g.cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "truncated") || !strings.Contains(err.Error(), "recorded head "+want.String()) ||
		!strings.Contains(err.Error(), "accept-head") {
		t.Fatalf("New on a cut log: %v; want a refusal naming the recorded head %s", err, want)
	}
	// The store rewritten too (its head set to the cut file's): the
	// newest signed checkpoint still refuses the log.
	st, err := store.Open(context.Background(), g.cfg.Store)
	if err != nil {
		t.Fatal(err)
	}
	cut, _, err := audit.CheckHead(g.cfg.Audit.Path, audit.Head{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.SetAuditHead(context.Background(), cut.Seq, cut.Hash); err != nil {
		t.Fatal(err)
	}
	st.Close()
	_, err = New(context.Background(), g.cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err == nil || !strings.Contains(err.Error(), "the newest checkpoint in "+cps) || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("New on a cut log with a rewritten store: %v; want a refusal naming the newest checkpoint", err)
	}
}
