// Package usage counts tool calls: input.usage, the windows a tool's
// policy reads (sluice.yaml usage:), counted in the store before each
// decision (Input); and the per-agent call counters, flushed to the store
// off the request path (Counters).
package usage

import (
	"context"
	"encoding/json"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sluice-gw/sluice/connectors"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
	"github.com/sluice-gw/sluice/gateway/storecheck"
	"github.com/sluice-gw/sluice/policy"
)

// Call is what Input counts a tool call under: the tool, the caller's
// agent, user and session, whether it is a new call (an approved hold's
// execution was counted when it was held) and its validated arguments.
type Call struct {
	Tool                 string
	Agent, User, Session string
	New                  bool
	Args                 *connectors.Args
}

// Input sets input.usage for a tool sluice.yaml's usage: counts. The
// call is counted before its decision, in the same store transaction that
// reads the windows, so the count a decision sees is every call of the
// tool by that agent (user, session) that reached its decision before it,
// this one included, whatever the earlier ones were decided: the 4th
// refund of the day sees count 4, on any number of gateways sharing the
// store. An approved hold being executed is not counted again (it was
// when it was held) but sees the windows as they are now. hash is the
// canonical request's hash (holds.Request.Hash) for usage.approved_before.
// When the store cannot count, nothing is decided and nothing is sent (503).
func Input(ctx context.Context, st *store.Store, cfg config.Usage, c Call, hash func() (string, error), in *policy.Input) *refusal.Error {
	counted, arg := cfg.Counted(c.Tool)
	if !counted {
		return nil
	}
	unavailable := func(err error) *refusal.Error {
		if e := storecheck.Refusal(err); e != nil {
			return e
		}
		return refusal.New(http.StatusServiceUnavailable, refusal.StoreUnavailable, "the usage this call's policy reads cannot be counted; the call was not sent").Wrap(err)
	}
	if st == nil {
		return refusal.New(http.StatusServiceUnavailable, refusal.StoreUnavailable, "bug(): usage is counted but the gateway has no store; the call was not sent")
	}
	var amount float64
	if arg != "" && c.Args != nil {
		amount = argNumber(c.Args.Body, arg)
	}
	scopes := make([]store.UsageScope, 0, 3)
	idx := [3]int{-1, -1, -1}
	for i, sc := range []store.UsageScope{{Scope: "agent", Who: c.Agent}, {Scope: "user", Who: c.User}, {Scope: "session", Who: c.Session}} {
		if sc.Who != "" { // no user or no session: nothing to count it under
			idx[i] = len(scopes)
			scopes = append(scopes, sc)
		}
	}
	ws, err := st.CountUsage(ctx, c.Tool, scopes, amount, c.New, time.Now())
	if err != nil {
		return unavailable(err)
	}
	u := &policy.Usage{}
	for i, dst := range []*policy.UsageWindows{&u.Agent, &u.User, &u.Session} {
		if idx[i] >= 0 {
			w := ws[idx[i]]
			*dst = policy.UsageWindows{Minute: policy.UsageWindow(w.Minute), Hour: policy.UsageWindow(w.Hour), Day: policy.UsageWindow(w.Day)}
		}
	}
	if hash != nil && c.Session != "" {
		h, err := hash()
		if err != nil {
			return unavailable(err)
		}
		if u.ApprovedBefore, err = st.ApprovedBefore(ctx, c.Session, c.Tool, h); err != nil {
			return unavailable(err)
		}
	}
	in.Usage = u
	return nil
}

// argNumber is the magnitude of the number at the dotted path in a
// decoded body, 0 when there is none (the schema decides whether the
// argument is required). The magnitude, because a negative amount must
// not lower a day's sum under a limit. One that is not finite is the
// largest float: a policy that limits sums sees it over any limit.
func argNumber(body any, path string) float64 {
	v := body
	for _, k := range strings.Split(path, ".") {
		m, ok := v.(map[string]any)
		if !ok {
			return 0
		}
		v = m[k]
	}
	var f float64
	switch n := v.(type) {
	case json.Number:
		f, _ = n.Float64()
	case float64:
		f = n
	case int:
		f = float64(n)
	case int64:
		f = float64(n)
	}
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return math.MaxFloat64
	}
	return math.Abs(f)
}

type usageKey struct{ agent, tool, action string }

// Counters aggregate call counters in memory; loop flushes them to the
// store once a second, off the request path: a slow disk must not add
// latency to calls, and the audit log, not the counters, is the record.
type Counters struct {
	mu sync.Mutex
	m  map[usageKey]int64
}

func (u *Counters) add(k usageKey) {
	u.mu.Lock()
	if u.m == nil {
		u.m = map[usageKey]int64{}
	}
	u.m[k]++
	u.mu.Unlock()
}

func (u *Counters) take() []store.Usage {
	u.mu.Lock()
	defer u.mu.Unlock()
	rows := make([]store.Usage, 0, len(u.m))
	for k, n := range u.m {
		rows = append(rows, store.Usage{Agent: k.agent, Tool: k.tool, Action: k.action, Count: n})
	}
	clear(u.m)
	return rows
}

// Loop flushes the counters to st once a second until ctx ends, and a
// last time then.
func (u *Counters) Loop(ctx context.Context, st *store.Store, log *slog.Logger) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			u.flush(context.Background(), st, log)
			return
		case <-t.C:
			u.flush(ctx, st, log)
		}
	}
}

func (u *Counters) flush(ctx context.Context, st *store.Store, log *slog.Logger) {
	if err := st.AddUsage(ctx, u.take()); err != nil {
		log.Warn("store: usage counters not written", "err", err)
	}
}

// Count counts one call of agent's to tool decided action.
func (u *Counters) Count(agent, tool, action string) { u.add(usageKey{agent, tool, action}) }
