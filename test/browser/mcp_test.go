package browser

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// TestMCPHoldApprovedInReviewUI is issue 19's "an ask call shows
// progress, then returns the result after an approval in the review UI":
// the agent calls an ask tool over MCP with the official Go SDK's client
// on the sandbox socket, with a progress token; the call stays open and
// reports progress; alice, signed in to the review UI in Chromium, opens
// the hold from her queue and approves it; the same tools/call then
// returns the upstream's result. The audit log has the hold (the ask's
// decision, transport mcp), alice's approval and the result; the upstream got the call
// once, with the credential the gateway attached.
func TestMCPHoldApprovedInReviewUI(t *testing.T) {
	r := newRig(t)
	alice := r.signIn("alice", "alice-pw")
	alice.do(chromedp.WaitVisible(chromedp.CSS("#live.on")))

	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	var progress atomic.Int32
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return wire.Dial(ctx, r.cfg.Gateway.SandboxSocket, agent)
	}}}
	cs, err := sdk.NewClient(&sdk.Implementation{Name: "browser-mcp", Version: "1"}, &sdk.ClientOptions{
		ProgressNotificationHandler: func(context.Context, *sdk.ProgressNotificationClientRequest) { progress.Add(1) },
	}).Connect(ctx, &sdk.StreamableClientTransport{Endpoint: "http://sluice/mcp", HTTPClient: hc}, nil)
	if err != nil {
		t.Fatalf("MCP connect over the sandbox socket: %v", err)
	}
	defer cs.Close()

	p := &sdk.CallToolParams{Name: "payments.create_refund", Arguments: map[string]any{"body": map[string]any{"amount": 42, "reason": "duplicate charge"}}}
	p.SetProgressToken("refund-1")
	done := make(chan *sdk.CallToolResult, 1)
	go func() {
		res, err := cs.CallTool(ctx, p)
		if err != nil {
			t.Errorf("tools/call: %v", err)
		}
		done <- res
	}()

	alice.do(chromedp.WaitVisible(chromedp.CSS("#queue li.hold-item.actionable")))
	h := r.pending(1)[0]
	for end := time.Now().Add(10 * time.Second); progress.Load() == 0 && time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
	}
	if progress.Load() == 0 {
		t.Fatal("no progress notification while the MCP call was held")
	}
	select {
	case res := <-done:
		t.Fatalf("the held call returned before approval: %+v", res)
	default:
	}
	alice.do(chromedp.Click(chromedp.CSS("#queue li.hold-item a")), chromedp.WaitVisible(chromedp.CSS("#approve")))
	if page := eval[string](alice, `document.body.innerText`); !strings.Contains(page, `"amount": 42`) || strings.Contains(page, secret) {
		t.Errorf("hold page: the arguments shown %v, the credential's value shown %v", strings.Contains(page, `"amount": 42`), strings.Contains(page, secret))
	}
	alice.shot("mcp-01-hold-page")
	alice.do(chromedp.SendKeys(chromedp.CSS("#approve-reason"), "approved over the review UI"),
		chromedp.Click(chromedp.CSS("#approve")),
		chromedp.WaitVisible(chromedp.CSS("#status")))

	var res *sdk.CallToolResult
	select {
	case res = <-done:
	case <-time.After(60 * time.Second):
		t.Fatal("the MCP call did not complete after the approval in the review UI")
	}
	if res == nil || res.IsError || len(res.Content) == 0 {
		t.Fatalf("approved MCP call: %+v; want the upstream's result", res)
	}
	text := res.Content[0].(*sdk.TextContent).Text
	if !strings.Contains(text, `"status":201`) || !strings.Contains(text, `"refund":"r-1"`) || strings.Contains(text, secret) {
		t.Fatalf("approved MCP call's result: %s", text)
	}
	got, err := r.gw.Holds().Get(context.Background(), h.ID)
	if err != nil || got.Status != holds.Done || got.DecidedBy != "alice" || got.DecisionReason != "approved over the review UI" {
		t.Fatalf("hold after approval: %+v %v", got, err)
	}
	r.mu.Lock()
	if len(r.hits) != 1 || r.keys[0] != secret {
		t.Errorf("upstream saw %d requests (key attached: %v)", len(r.hits), len(r.keys) > 0 && r.keys[0] == secret)
	}
	r.mu.Unlock()

	// The audit log: the decision with transport mcp, alice's approval,
	// the result, all under the held call's request id.
	recs, err := tailAudit(r.cfg.Audit.Path, 1000)
	if err != nil {
		t.Fatal(err)
	}
	events := map[string]map[string]any{}
	for _, raw := range recs {
		var rec struct {
			RequestID string         `json:"request_id"`
			Event     string         `json:"event"`
			Fields    map[string]any `json:"fields"`
		}
		if json.Unmarshal(raw, &rec) == nil && rec.RequestID == h.RequestID && events[rec.Event] == nil {
			events[rec.Event] = rec.Fields // the first: the door's decision, before the approved run's
		}
		if strings.Contains(string(raw), secret) {
			t.Errorf("an audit record carries the credential's value: %s", raw)
		}
	}
	// An ask's decision is its hold_created record (the "decision" record
	// under the same id is the approved run's, which names no door).
	if c := events["hold_created"]; c == nil || c["decision"] != "ask" || c["hold"] != h.ID || c["transport"] != "mcp" {
		t.Errorf("hold_created record of %s: %v", h.RequestID, c)
	}
	if a := events["hold_approved"]; a == nil || a["by"] != "alice" {
		t.Errorf("hold_approved record of %s: %v; want by alice", h.RequestID, a)
	}
	if events["result"] == nil {
		t.Errorf("no result record for %s (records: %v)", h.RequestID, keys(events))
	}
}

func keys(m map[string]map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
