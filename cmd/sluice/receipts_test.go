package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/receipts"
)

func TestReceiptsKeyAndVerify(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "sluice.yaml")
	keyFile := filepath.Join(dir, "receipts.key")
	if err := os.WriteFile(cfg, []byte("audit: { path: "+filepath.Join(dir, "audit.log")+" }\nreceipts: { key_file: "+keyFile+" }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := cli(t, "", "receipts", "key", "--config", cfg); err == nil || !strings.Contains(err.Error(), "sluice serve makes it") {
		t.Fatalf("receipts key before any serve: %v", err)
	}
	priv, err := receipts.LoadKey(keyFile, true) // as serve does at its first start
	if err != nil {
		t.Fatal(err)
	}
	pem, _, err := cli(t, "", "receipts", "key", "--config", cfg)
	if err != nil || !strings.Contains(pem, "BEGIN PUBLIC KEY") {
		t.Fatalf("receipts key: %v %q", err, pem)
	}
	pubFile := filepath.Join(dir, "receipts.pub")
	if err := os.WriteFile(pubFile, []byte(pem), 0o644); err != nil {
		t.Fatal(err)
	}
	file, err := receipts.NewSigner(priv).Sign(context.Background(), receipts.Receipt{HoldID: "h_1", Tool: "tickets.create_refund", Approver: "bob",
		ApprovedAt: time.Now(), ExecutedAt: time.Now(), RequestSHA256: strings.Repeat("0", 64), PolicyRevision: "r1", Decision: "ask", UpstreamStatus: 201})
	if err != nil {
		t.Fatal(err)
	}
	rf := filepath.Join(dir, "receipt.json")
	if err := os.WriteFile(rf, file, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli(t, "", "receipts", "verify", rf, "--key", pubFile)
	if err != nil || !strings.Contains(out, "receipt OK") || !strings.Contains(out, "by bob") || !strings.Contains(out, "upstream status 201") {
		t.Fatalf("verify: %v %q", err, out)
	}
	bad := append([]byte(nil), file...)
	bad[strings.Index(string(bad), "201")] = '3' // upstream status 301
	if err := os.WriteFile(rf, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := cli(t, "", "receipts", "verify", rf, "--key", pubFile); err == nil || !strings.Contains(err.Error(), "bad signature") {
		t.Fatalf("verify of a changed receipt: %v %q, want bad signature", err, out)
	}
}
