//go:build linux

package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// withApprovers rewrites the config at path: the refund rule asks
// group:finance, carol (in finance) has an API token, and calls wait only
// briefly before 202.
func withApprovers(t *testing.T, path, token string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	for _, p := range doc["policies"].([]any) {
		if r := p.(map[string]any); r["match"] == "tickets.create_refund" {
			r["approvers"] = []string{"group:finance"}
		}
	}
	doc["gateway"].(map[string]any)["hold_wait"] = "100ms"
	sum := sha256.Sum256([]byte(token))
	doc["approvers"] = map[string]any{"users": []map[string]any{{"name": "carol", "groups": []string{"finance"}, "token_sha256": hex.EncodeToString(sum[:])}}}
	if data, err = yaml.Marshal(doc); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
}

// adminDo calls the admin API inside the namespace with a bearer token.
func (g *gateway) adminDo(t *testing.T, method, path, token, body string) (int, map[string]any) {
	t.Helper()
	tr := &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var c net.Conn
			err := g.e.ns.do(func() (err error) {
				c, err = (&net.Dialer{Timeout: 2 * time.Second}).DialContext(ctx, network, addr)
				return err
			})
			return c, err
		},
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequest(method, "http://"+g.admin+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := (&http.Client{Transport: tr, Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		t.Fatalf("admin %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	g.e.keep(b)
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("admin %s %s: %d %q", method, path, resp.StatusCode, b)
	}
	return resp.StatusCode, m
}

// TestHoldSurvivesKill9: a held call survives `kill -9` of the gateway
// (THREATS G1); approved after the restart it is sent exactly once, with
// the credential, and the agent's poll gets the result.
func TestHoldSurvivesKill9(t *testing.T) {
	e := newEnv(t)
	cfg, admin := e.writeConfig(e.mainConfig())
	const token = "carol-token-0123456789"
	withApprovers(t, cfg, token)
	e.setSecret(cfg)
	g := e.startGateway(cfg, admin)
	g1 := casebook.Expect(t, "G1", "kill -9 of the gateway with a held Ask call, then restart and approve",
		"after restart the poll is still 202 pending, nothing upstream; approval executes exactly once with the credential")
	e3 := casebook.Expect(t, "E3", "approve the same hold twice (after a restart)",
		"first approve executes, second 409, exactly one upstream request")
	var obs []string
	defer func() {
		g1.Observe(strings.Join(obs, "; "))
		e3.Observef("%s; upstream requests %d", strings.Join(obs[min(len(obs), 1):], "; "), len(e.up.requests()))
	}()

	r := g.call(t, agentA, "tickets.create_refund", `{"body":{"amount":5,"reason":"dup"}}`)
	var held struct {
		Hold struct{ ID, Status, Poll string } `json:"hold"`
	}
	if err := json.Unmarshal(r.Body, &held); err != nil || r.Status != http.StatusAccepted || held.Hold.Status != "pending" {
		t.Fatalf("ask: %d %s, want 202 pending", r.Status, r.Body)
	}
	g.signal(syscall.SIGKILL)
	<-g.exited

	g = e.startGateway(cfg, admin)
	if n := len(e.up.requests()); n != 0 {
		t.Fatalf("%d upstream requests before approval", n)
	}
	p := g.do(t, agentA, http.MethodGet, held.Hold.Poll, "", nil)
	obs = append(obs, fmt.Sprintf("ask %d, after kill -9 and restart poll %d with %d upstream requests", r.Status, p.Status, len(e.up.requests())))
	if p.Status != http.StatusAccepted {
		t.Fatalf("poll after restart: %d %s, want 202 (still pending)", p.Status, p.Body)
	}
	st, body := g.adminDo(t, http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/approve", token, `{"reason":"ok"}`)
	hold, _ := body["hold"].(map[string]any)
	obs = append(obs, fmt.Sprintf("approve %d %v", st, hold["status"]))
	if st != http.StatusOK || body["hold"].(map[string]any)["status"] != "executed" {
		t.Fatalf("approve after restart: %d %v", st, body)
	}
	st2, _ := g.adminDo(t, http.MethodPost, "/api/v1/holds/"+held.Hold.ID+"/approve", token, "")
	obs = append(obs, fmt.Sprintf("second approve %d", st2))
	if st2 != http.StatusConflict {
		t.Fatalf("second approve: %d, want 409", st2)
	}
	p = g.do(t, agentA, http.MethodGet, held.Hold.Poll+"?wait=5s", "", nil)
	obs = append(obs, fmt.Sprintf("poll %d with upstream status %d", p.Status, p.Result.Status))
	if p.Status != http.StatusOK || p.Result.Status != 200 || !strings.Contains(string(p.Result.Body), `"refund":"ok"`) {
		t.Fatalf("poll after approval: %d %s", p.Status, p.Body)
	}
	reqs := e.up.requests()
	if len(reqs) != 1 || reqs[0].Path != "/refunds" || reqs[0].Header.Get("X-Api-Key") != e.secret {
		t.Fatalf("upstream saw %d requests (%+v); want exactly one POST /refunds with the credential", len(reqs), reqs)
	}
}
