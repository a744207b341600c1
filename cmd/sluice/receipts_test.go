package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/receipts"
	"github.com/sluice-gw/sluice/vault"
	"github.com/sluice-gw/sluice/vault/vaulttest"
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

// TestReceiptsKeyFromVaultTransit: with receipts.signer vault-transit,
// `sluice receipts key` reads the transit key's latest version from a
// real Vault (logging in by AppRole as serve does) and --all every
// version; a receipt that version signed inside Vault verifies offline
// with the printed PEM, and with one byte changed it does not.
func TestReceiptsKeyFromVaultTransit(t *testing.T) {
	srv := vaulttest.Start(t)
	srv.Mount(t, "transit", "transit")
	srv.Write(t, "transit/keys/receipts", map[string]any{"type": "ed25519"})
	srv.Write(t, "transit/keys/receipts/rotate", map[string]any{})
	dir := t.TempDir()
	rid, sid := srv.AppRole(t, dir, "gateway", `path "transit/keys/*" { capabilities = ["read"] }
path "transit/sign/*" { capabilities = ["update"] }
`, "1h")
	cfg := filepath.Join(dir, "sluice.yaml")
	yaml := fmt.Sprintf("audit: { path: %s/audit.log }\nsecrets:\n  backend: vault\n  vault: { address: %s, auth: { method: approle, role_id_file: %s, secret_id_file: %s } }\nreceipts: { signer: vault-transit, transit_key: receipts }\n",
		dir, srv.Addr, rid, sid)
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	pem, _, err := cli(t, "", "receipts", "key", "--config", cfg)
	if err != nil || strings.Count(pem, "BEGIN PUBLIC KEY") != 1 || !strings.Contains(pem, "(vault transit key transit/keys/receipts version 2)") {
		t.Fatalf("receipts key: %v %q", err, pem)
	}
	all, _, err := cli(t, "", "receipts", "key", "--all", "--config", cfg)
	if err != nil || strings.Count(all, "BEGIN PUBLIC KEY") != 2 || !strings.HasPrefix(all, pem) || !strings.Contains(all, "version 1)") {
		t.Fatalf("receipts key --all: %v %q", err, all)
	}

	// Sign as the gateway does, inside Vault.
	v, err := vault.OpenVault(context.Background(), vault.VaultConfig{Address: srv.Addr,
		Auth: vault.VaultAuth{Method: "approle", RoleIDFile: rid, SecretIDFile: sid}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.Close(context.Background()) })
	file, err := receipts.NewKeySigner(vault.NewTransitEd25519(v, "receipts")).Sign(context.Background(), receipts.Receipt{HoldID: "h_2", Tool: "tickets.create_refund",
		Approver: "bob", ApprovedAt: time.Now(), ExecutedAt: time.Now(), RequestSHA256: strings.Repeat("0", 64), PolicyRevision: "r1", Decision: "ask", UpstreamStatus: 201})
	if err != nil {
		t.Fatal(err)
	}
	pubFile, rf := filepath.Join(dir, "receipts.pub"), filepath.Join(dir, "receipt.json")
	if err := errors.Join(os.WriteFile(pubFile, []byte(pem), 0o644), os.WriteFile(rf, file, 0o644)); err != nil {
		t.Fatal(err)
	}
	out, _, err := cli(t, "", "receipts", "verify", rf, "--key", pubFile)
	if err != nil || !strings.Contains(out, "receipt OK") || !strings.Contains(out, "key       vault transit key transit/keys/receipts version 2") {
		t.Fatalf("verify: %v %q", err, out)
	}
	bad := append([]byte(nil), file...)
	bad[strings.Index(string(bad), "version 2")+8] = '1' // claims version 1
	if err := os.WriteFile(rf, bad, 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := cli(t, "", "receipts", "verify", rf, "--key", pubFile); err == nil || !strings.Contains(err.Error(), "bad signature") {
		t.Fatalf("verify of a changed receipt: %v %q, want bad signature", err, out)
	}
}
