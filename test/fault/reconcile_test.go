//go:build linux

package fault

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestKill9ReconcilesIdempotentHold (G2, the idempotency-keyed half): the
// gateway is killed while two approved holds of tickets.create_charge, an
// operation that declares the Idempotency-Key header, are being sent (the
// upstream applies each charge, then hangs: the reply is lost). After a
// restart each is audited hold_reconciling, re-sent once in the background
// with the same key (the hold's ID, or the agent's own key when its
// arguments carried one), and the upstream answers the repeat with its
// stored first reply: the agent's poll gets that reply, the charge is
// applied once, and the hold is finished (hold_executed reconciled=true);
// a second approve is 409. TestKill9WithHeldCalls covers the operation
// without a key, which is never re-sent.
func TestKill9ReconcilesIdempotentHold(t *testing.T) {
	eachStore(t, func(t *testing.T, sk storeKind) {
		e := newEnv(t)
		d := e.BaseConfig("reconcile")
		sk.apply(d)
		d["policies"] = append([]map[string]any{
			{"match": "tickets.create_charge", "action": "ask", "approvers": []string{"group:finance"}},
		}, d["policies"].([]map[string]any)...)
		path := e.Write(d)
		g := e.Start(d, path)
		c := casebook.Expect(t, "G2", sk.threat("kill -9 while two approved holds of an idempotency-keyed operation (Idempotency-Key header parameter) are being sent (upstream applied them, reply lost), then restart"),
			"hold_reconciling then hold_executed reconciled=true; agent's poll 200 with the upstream's first reply (replayed); upstream saw exactly 2 requests per hold, both with Idempotency-Key = hold id (or the agent's own key), and charged once per hold; second approve 409")

		type held struct {
			name, args string
			amount     int    // tells the hold's upstream requests apart
			key        string // the agent's own Idempotency-Key; "" for the hold's ID
			id         string
		}
		hs := []*held{
			{name: "gateway key", args: `{"body":{"amount":7}}`, amount: 7},
			{name: "agent key", args: `{"headers":{"Idempotency-Key":"agent-key-8"},"body":{"amount":8}}`, amount: 8, key: "agent-key-8"},
		}
		for _, h := range hs {
			r := g.Call(agentA, "tickets.create_charge", h.args)
			if r.Status != http.StatusAccepted || r.HoldState != "pending" || r.HoldID == "" {
				t.Fatalf("%s: ask: %d %s, want 202 pending", h.name, r.Status, r.Body)
			}
			h.id = r.HoldID
			if h.key == "" {
				h.key = h.id
			}
		}
		e.Up.SetMode(gwenv.ModeHang)
		for _, h := range hs {
			go func() {
				// The approve blocks while the upstream hangs; the gateway dies under it.
				req, _ := http.NewRequest(http.MethodPost, "http://"+g.Admin+"/api/v1/holds/"+h.id+"/approve", strings.NewReader(`{"reason":"ok"}`))
				req.Header.Set("Authorization", "Bearer "+gwenv.CarolToken)
				if resp, err := g.AdminClient().Do(req); err == nil {
					resp.Body.Close()
				}
			}()
		}
		e.Up.AwaitRequest(t, 30*time.Second)
		e.Up.AwaitRequest(t, 30*time.Second)
		if n := e.Up.Charges(); n != 2 {
			t.Fatalf("before the kill the upstream applied %d charges, want 2 (one per hold)", n)
		}
		g.Kill9()

		e.Up.SetMode(gwenv.ModeOK)
		g = e.Start(d, path)
		var obs []string
		for _, h := range hs {
			t.Run(h.name, func(t *testing.T) {
				g := g.For(t)
				p := g.Do(agentA, http.MethodGet, "/v1/holds/"+h.id+"?wait=30s", "", nil)
				recon := g.AwaitAuditFields("hold_reconciling", map[string]any{"hold": h.id})
				exec := g.AwaitAuditFields("hold_executed", map[string]any{"hold": h.id, "reconciled": true})
				order := -1
				for i, r := range g.AuditRecords() {
					f, _ := r["fields"].(map[string]any)
					switch {
					case f["hold"] != h.id:
					case r["event"] == "hold_reconciling":
						order = i
					case r["event"] == "hold_executed" && order < 0:
						t.Errorf("hold_executed before hold_reconciling: %v", r)
					case r["event"] == "hold_outcome_unknown":
						t.Errorf("a keyed hold became outcome_unknown: %v", r)
					}
				}
				rf, _ := recon["fields"].(map[string]any)
				if rf["idempotency_header"] != "Idempotency-Key" || strings.Contains(fmt.Sprint(rf), e.Secret) {
					t.Errorf("hold_reconciling fields %v, want the header name (and no secret)", rf)
				}
				ef, _ := exec["fields"].(map[string]any)
				if ef["outcome"] != "executed" {
					t.Errorf("hold_executed fields %v, want outcome executed", ef)
				}
				replayed := p.Result.Headers["Idempotent-Replayed"]
				if p.Status != http.StatusOK || p.Result.Status != http.StatusOK || !strings.Contains(string(p.Result.Body), `"charge":"ch_`) ||
					len(replayed) != 1 || replayed[0] != "true" {
					t.Errorf("poll after restart: %d %s, want 200 with the upstream's stored first reply (Idempotent-Replayed)", p.Status, p.Body)
				}
				var keys []string
				for _, r := range e.Up.Requests() {
					if r.Path != "/charges" || !strings.Contains(r.Body, fmt.Sprintf(`"amount":%d`, h.amount)) {
						continue
					}
					keys = append(keys, r.Header.Get("Idempotency-Key"))
					if r.Header.Get("X-Api-Key") != e.Secret {
						t.Errorf("upstream request without the credential: %+v", r.Header)
					}
				}
				if len(keys) != 2 || keys[0] != h.key || keys[1] != h.key {
					t.Errorf("upstream saw Idempotency-Key %q for this hold, want exactly 2 requests both with %q", keys, h.key)
				}
				st, code, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+h.id+"/approve", gwenv.CarolToken, `{"reason":"again"}`)
				if st != http.StatusConflict {
					t.Errorf("approve the reconciled hold again: %d %s, want 409", st, code)
				}
				obs = append(obs, fmt.Sprintf("%s: audit %v→%v reconciled=%v, poll %d replayed=%v, upstream keys %d (= key: %v), second approve %d",
					h.name, recon["event"], exec["event"], ef["reconciled"], p.Status, replayed, len(keys), len(keys) == 2 && keys[0] == h.key && keys[1] == h.key, st))
			})
		}
		charges := e.Up.Charges()
		if charges != 2 {
			t.Errorf("the upstream applied %d charges, want 2 (each hold once)", charges)
		}
		c.Observef("%s; charges applied %d for 2 holds", strings.Join(obs, "; "), charges)
	})
}

// TestKill9ReconcileWithoutAnswer (G2): as TestKill9ReconcilesIdempotentHold,
// but after the restart the re-send gets no HTTP answer: the upstream
// resets its connection, or it is never sent because the policy now
// blocks the tool. Either way the first send may have been applied, so the
// hold becomes outcome_unknown (audited, reconciled=true), the agent's poll
// is 502 upstream_error, and it is not sent again.
func TestKill9ReconcileWithoutAnswer(t *testing.T) {
	eachStore(t, func(t *testing.T, sk storeKind) {
		cases := []struct {
			name      string
			mode      gwenv.Mode // the upstream after the restart
			action    string     // create_charge's policy after the restart
			wantSends int        // upstream requests for the hold in all
		}{
			{"connection reset", gwenv.ModeReset, "ask", 2},
			{"policy now blocks", gwenv.ModeOK, "block", 1},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				e := newEnv(t)
				d := e.BaseConfig("noanswer")
				sk.apply(d)
				rule := map[string]any{"match": "tickets.create_charge", "action": "ask", "approvers": []string{"group:finance"}}
				d["policies"] = append([]map[string]any{rule}, d["policies"].([]map[string]any)...)
				path := e.Write(d)
				g := e.Start(d, path)
				c := casebook.Expect(t, "G2", sk.threat("kill -9 while an approved idempotency-keyed hold is being sent; after restart its re-send gets no HTTP answer: "+tc.name),
					fmt.Sprintf("hold_reconciling then hold_outcome_unknown reconciled=true; poll 502 upstream_error; exactly %d upstream request(s), all with the hold id as key, 1 charge; not sent again", tc.wantSends))

				r := g.Call(agentA, "tickets.create_charge", `{"body":{"amount":9}}`)
				if r.Status != http.StatusAccepted || r.HoldID == "" {
					t.Fatalf("ask: %d %s, want 202 pending", r.Status, r.Body)
				}
				id := r.HoldID
				e.Up.SetMode(gwenv.ModeHang)
				go func() {
					req, _ := http.NewRequest(http.MethodPost, "http://"+g.Admin+"/api/v1/holds/"+id+"/approve", strings.NewReader(`{"reason":"ok"}`))
					req.Header.Set("Authorization", "Bearer "+gwenv.CarolToken)
					if resp, err := g.AdminClient().Do(req); err == nil {
						resp.Body.Close()
					}
				}()
				e.Up.AwaitRequest(t, 30*time.Second)
				g.Kill9()

				e.Up.SetMode(tc.mode)
				if tc.action != "ask" {
					rule["action"] = tc.action
					delete(rule, "approvers")
					path = e.Write(d)
				}
				g = e.Start(d, path)
				p := g.Do(agentA, http.MethodGet, "/v1/holds/"+id+"?wait=30s", "", nil)
				g.AwaitAuditFields("hold_reconciling", map[string]any{"hold": id})
				unk := g.AwaitAuditFields("hold_outcome_unknown", map[string]any{"hold": id, "reconciled": true})
				time.Sleep(500 * time.Millisecond) // a retry loop would have sent again by now
				var keys []string
				for _, r := range e.Up.Requests() {
					if r.Path == "/charges" {
						keys = append(keys, r.Header.Get("Idempotency-Key"))
					}
				}
				executed := len(g.AuditEvent("hold_executed", id))
				st, _, _ := g.AdminDo(http.MethodPost, "/api/v1/holds/"+id+"/approve", gwenv.CarolToken, `{"reason":"again"}`)
				c.Observef("audit %v, poll %d %s, upstream keys %q, charges %d, hold_executed %d, second approve %d",
					unk["event"], p.Status, p.Code, keys, e.Up.Charges(), executed, st)
				if p.Status != http.StatusBadGateway || p.Code != "upstream_error" {
					t.Errorf("poll: %d %s, want 502 upstream_error (outcome unknown)", p.Status, p.Body)
				}
				if len(keys) != tc.wantSends {
					t.Errorf("upstream saw %d requests (keys %q), want %d", len(keys), keys, tc.wantSends)
				}
				for _, k := range keys {
					if k != id {
						t.Errorf("upstream saw Idempotency-Key %q, want the hold id %s", k, id)
					}
				}
				if n := e.Up.Charges(); n != 1 {
					t.Errorf("%d charges applied, want 1", n)
				}
				if executed != 0 {
					t.Errorf("%d hold_executed records for a hold whose outcome is unknown", executed)
				}
				if st != http.StatusConflict {
					t.Errorf("approve the outcome_unknown hold again: %d, want 409", st)
				}
			})
		}
	})
}
