package gateway

import (
	"context"
	"crypto/ed25519"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/receipts"
	"github.com/sluice-gw/sluice/sandboxd/wire"
	"github.com/sluice-gw/sluice/vault/vaulttest"
)

// transitReceiptsYAML is TestVaultCredentials's gateway on Vault (its
// head) whose receipts are signed by a transit key (%[9]s); kv.* calls
// are held for bob.
var transitReceiptsYAML = vaultGatewayYAML[:strings.Index(vaultGatewayYAML, "connectors:")] + `receipts: { signer: vault-transit, transit_key: %[9]s }
connectors:
  - slug: kv
    spec: %[8]s
    base_url: %[2]s
    allow_private: [127.0.0.0/8]
    credential: { vault: { kv: secret/data/vaulted, field: api_key } }
agents:
  - { name: agent-a, connectors: [kv] }
policies:
  - { match: "kv.*", action: ask, approvers: [bob] }
`

// receiptsPolicy is the gateway's Vault policy: the KV credential, and
// the receipts key's versions and signing (withSign).
func receiptsPolicy(withSign bool) string {
	p := "path \"secret/data/*\" { capabilities = [\"read\"] }\npath \"transit/keys/*\" { capabilities = [\"read\"] }\n"
	if withSign {
		p += "path \"transit/sign/*\" { capabilities = [\"update\"] }\n"
	}
	return p
}

// newTransitGateway makes (not serves) a gateway whose receipts key is
// the transit key named key.
func newTransitGateway(t *testing.T, srv *vaulttest.Server, upURL, key string, withSign bool) (*Server, *config.Config, string, *syncBuffer, error) {
	t.Helper()
	dir, err := os.MkdirTemp("", "sluice-rtgw-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	rid, sid := srv.AppRole(t, dir, "gateway", receiptsPolicy(withSign), "1h")
	spec, _ := filepath.Abs("testdata/vaulted.yaml")
	cfg, err := config.Parse([]byte(fmt.Sprintf(transitReceiptsYAML, dir, upURL, srv.Addr, os.Getuid(), rid, sid, tokenHash("tok-sandboxd"), spec, key)+approversYAML), dir)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Gateway.HoldWait = config.Duration(50 * time.Millisecond)
	logBuf := &syncBuffer{}
	gw, err := New(context.Background(), cfg, Options{Logger: slog.New(slog.NewJSONHandler(logBuf, nil))})
	return gw, cfg, dir, logBuf, err
}

// TestReceiptsSignedByVaultTransit: with receipts.signer vault-transit a
// held call's receipt is signed inside Vault by an ed25519 transit key;
// it verifies offline (receipts.Verify, what `sluice receipts verify`
// runs) with the key the gateway serves, which is the key Vault publishes;
// one byte changed does not. After a rotation the new version signs and
// the old receipt still verifies with the old version's served key. When
// Vault refuses to sign, the approved call still executes (it was sent
// before signing) and is recorded without a receipt, logged and counted.
// A missing key, one that is not ed25519 or one the gateway may not sign
// with fails the start, naming it.
func TestReceiptsSignedByVaultTransit(t *testing.T) {
	srv := vaulttest.Start(t)
	srv.Write(t, "secret/data/vaulted", map[string]any{"data": map[string]any{"api_key": "kv-key-for-receipts-0001"}})
	srv.Mount(t, "transit", "transit")
	srv.Write(t, "transit/keys/receipts", map[string]any{"type": "ed25519"})
	srv.Write(t, "transit/keys/not-ed", map[string]any{"type": "ecdsa-p256"})
	up := newVaultedUpstream(t, nil)

	t.Run("a key that is missing, not ed25519 or not signable fails the start, named", func(t *testing.T) {
		for _, tc := range []struct {
			key      string
			withSign bool
			want     string
		}{{"no-such-key", true, "not found"}, {"not-ed", true, "ed25519"}, {"receipts", false, "transit/sign/receipts: status 403"}} {
			gw, _, _, _, err := newTransitGateway(t, srv, up.URL, tc.key, tc.withSign)
			if err == nil {
				gw.Close()
				t.Fatalf("transit_key %s: the gateway started", tc.key)
			}
			if !strings.Contains(err.Error(), `receipts.transit_key "`+tc.key+`"`) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("transit_key %s: %v: want the key named and %q", tc.key, err, tc.want)
			}
		}
	})

	gw, cfg, dir, logBuf, err := newTransitGateway(t, srv, up.URL, "receipts", true)
	if err != nil {
		t.Fatalf("New: %v\n%s", err, srv.Log())
	}
	g := serveTest(t, gw, cfg, dir, logBuf)
	c := g.client(wire.Identity{Sandbox: "sb-1", Agent: "agent-a", Session: "s-1", User: "alice", Host: "h1"})

	// executed holds one call and returns its receipt reply.
	executed := func(t *testing.T) (string, reply) {
		t.Helper()
		id, _ := holdOf(t, doCall(t, c, "kv.kv", `{}`))
		if ar := g.admin(t, "tok-bob", "POST", "/api/v1/holds/"+id+"/approve", `{"reason":"ok"}`); ar.status != 200 {
			t.Fatalf("approve: %d %s", ar.status, ar.raw)
		}
		return id, g.admin(t, "tok-bob", "GET", "/api/v1/holds/"+id+"/receipt", "")
	}
	// served are the keys GET /api/v1/receipts/key serves, newest first.
	served := func(t *testing.T) []receipts.Public {
		t.Helper()
		kr := g.admin(t, "", "GET", "/api/v1/receipts/key", "")
		var body struct {
			KeyID string `json:"key_id"`
			PEM   string `json:"public_key_pem"`
			Keys  []struct {
				KeyID string `json:"key_id"`
				Name  string `json:"name"`
				PEM   string `json:"public_key_pem"`
			} `json:"keys"`
		}
		if kr.status != 200 || json.Unmarshal([]byte(kr.raw), &body) != nil || len(body.Keys) == 0 || body.Keys[0].PEM != body.PEM || body.Keys[0].KeyID != body.KeyID {
			t.Fatalf("receipts key: %d %s", kr.status, kr.raw)
		}
		var out []receipts.Public
		for _, k := range body.Keys {
			pub, err := receipts.ParsePublicKey([]byte(k.PEM))
			if err != nil || receipts.KeyID(pub) != k.KeyID {
				t.Fatalf("served key %s: %v", k.KeyID, err)
			}
			out = append(out, receipts.Public{KeyID: k.KeyID, Name: k.Name, Key: pub})
		}
		return out
	}
	// vaultPub is the public key Vault publishes for the version.
	vaultPub := func(t *testing.T, version string) ed25519.PublicKey {
		t.Helper()
		sec, err := srv.Client(t).Logical().Read("transit/keys/receipts")
		if err != nil || sec == nil {
			t.Fatalf("read transit/keys/receipts: %v", err)
		}
		k, _ := sec.Data["keys"].(map[string]any)[version].(map[string]any)
		b, err := base64.StdEncoding.DecodeString(fmt.Sprint(k["public_key"]))
		if err != nil || len(b) != ed25519.PublicKeySize {
			t.Fatalf("Vault's public key of version %s: %v %v", version, k, err)
		}
		return b
	}

	var first []byte
	var firstKey receipts.Public
	t.Run("a receipt signed by transit verifies offline with the served key; one changed byte does not", func(t *testing.T) {
		id, rr := executed(t)
		if rr.status != 200 {
			t.Fatalf("receipt: %d %s", rr.status, rr.raw)
		}
		keys := served(t)
		if len(keys) != 1 || !keys[0].Key.Equal(vaultPub(t, "1")) || keys[0].Name != "vault transit key transit/keys/receipts version 1" {
			t.Fatalf("served keys %+v: want Vault's version 1", keys)
		}
		first, firstKey = []byte(rr.raw), keys[0]
		rc, err := receipts.Verify(first, keys[0].Key)
		if err != nil {
			t.Fatalf("Verify: %v\n%s", err, first)
		}
		if rc.HoldID != id || rc.Approver != "bob" || rc.UpstreamStatus != 200 || rc.KeyID != keys[0].KeyID || rc.Key != keys[0].Name {
			t.Fatalf("receipt %+v", rc)
		}
		if strings.Contains(rr.raw, "vault:v") || strings.Contains(rr.raw, "kv-key-for-receipts-0001") {
			t.Fatalf("the receipt carries Vault's signature framing or the credential: %s", rr.raw)
		}
		for i := range first {
			bad := append([]byte(nil), first...)
			bad[i] ^= 1
			if _, err := receipts.Verify(bad, keys[0].Key); err == nil {
				t.Fatalf("receipt with byte %d changed verifies", i)
			}
		}
	})
	if first == nil {
		t.FailNow()
	}

	t.Run("after a rotation the new version signs and the old receipt still verifies", func(t *testing.T) {
		srv.Write(t, "transit/keys/receipts/rotate", map[string]any{})
		time.Sleep(2100 * time.Millisecond) // the key's versions are cached for cache_ttl (2s)
		_, rr := executed(t)
		keys := served(t)
		if rr.status != 200 || len(keys) != 2 || !keys[0].Key.Equal(vaultPub(t, "2")) || keys[1].KeyID != firstKey.KeyID {
			t.Fatalf("receipt %d %s; served keys %+v", rr.status, rr.raw, keys)
		}
		rc, err := receipts.Verify([]byte(rr.raw), keys[0].Key)
		if err != nil || rc.Key != "vault transit key transit/keys/receipts version 2" {
			t.Fatalf("Verify after rotation: %v %+v", err, rc)
		}
		if _, err := receipts.Verify([]byte(rr.raw), keys[1].Key); err == nil || !strings.Contains(err.Error(), "signed by key "+keys[0].KeyID) {
			t.Fatalf("the new receipt against version 1's key: %v, want refused naming the key", err)
		}
		if _, err := receipts.Verify(first, keys[1].Key); err != nil {
			t.Fatalf("the receipt of version 1 after the rotation: %v", err)
		}
	})

	t.Run("Vault refusing to sign: the call executes, recorded without a receipt, logged and counted", func(t *testing.T) {
		if err := srv.Client(t).Sys().PutPolicy("gateway", receiptsPolicy(false)); err != nil {
			t.Fatal(err)
		}
		before := up.requests.Load()
		id, rr := executed(t)
		if up.requests.Load() != before+1 {
			t.Fatalf("the approved call reached the upstream %d times, want once", up.requests.Load()-before)
		}
		h := g.admin(t, "tok-bob", "GET", "/api/v1/holds/"+id, "")
		hold, _ := h.body["hold"].(map[string]any)
		if rr.status != 404 || hold["status"] != "executed" {
			t.Fatalf("receipt %d %s; hold %v: want 404 and an executed hold", rr.status, rr.raw, hold)
		}
		if v := sample(scrape(t, g), "sluice_receipts_sign_failures_total"); v != "1" {
			t.Fatalf("sluice_receipts_sign_failures_total = %q, want 1", v)
		}
		if !strings.Contains(logBuf.String(), "could not be signed") || !strings.Contains(logBuf.String(), id) || !strings.Contains(logBuf.String(), "transit/sign/receipts") {
			t.Fatalf("no log line names the hold and the refused signing:\n%s", logBuf.String())
		}
	})
}
