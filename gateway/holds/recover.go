package holds

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
)

// Recover runs at startup, before anything is served. A hold that was
// executing when the gateway stopped may or may not have reached the
// upstream:
//   - if its operation is not idempotency-keyed it becomes outcome_unknown
//     (audited hold_outcome_unknown) for a person to look at, and is never
//     re-sent;
//   - if it is, it stays executing, is audited hold_reconciling, and Run
//     re-sends it once in the background with the same key (the upstream
//     answers a repeated key with its first reply and does not act twice);
//     see reconcileHold.
//
// Pending holds stay pending (or expire). Recover does not wait for any
// upstream.
func (m *Manager) Recover(ctx context.Context) error {
	rows, err := m.o.Store.ListHolds(ctx, store.HoldQuery{Statuses: []string{string(Running)}, Limit: maxRecover})
	if err != nil {
		return fmt.Errorf("holds: recover: %w", err)
	}
	var keyed []string
	for _, r := range rows {
		h, err := fromRow(r)
		if err != nil {
			return fmt.Errorf("holds: recover: %w", err)
		}
		if h.IdempotencyHeader != "" {
			from := "hold_id"
			if http.Header(h.Request.Headers).Get(h.IdempotencyHeader) != "" {
				from = "arguments"
			}
			// The header's name and where its value comes from; the value
			// itself is the hold's ID or the agent's (in the stored request).
			if err := m.o.Audit(ctx, "hold_reconciling", h, map[string]any{"idempotency_header": h.IdempotencyHeader, "idempotency_key_from": from}); err != nil {
				return fmt.Errorf("holds: recover: audit: %w", err)
			}
			m.log.Warn("holds: the gateway stopped while this approved call was being sent; it is idempotency-keyed and is re-sent once with the same key", "hold", h.ID)
			keyed = append(keyed, h.ID)
			continue
		}
		ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Running), string(Unknown), nil)
		if err != nil {
			return fmt.Errorf("holds: recover: %w", err)
		}
		if !ok {
			continue // no longer executing: someone else recorded it
		}
		h.Status = Unknown
		if err := m.o.Audit(ctx, "hold_outcome_unknown", h, nil); err != nil {
			return fmt.Errorf("holds: recover: audit: %w", err)
		}
		m.log.Warn("holds: the gateway stopped while this approved call was being sent; its outcome is unknown and it is not re-sent", "hold", h.ID)
	}
	m.mu.Lock()
	m.reconcile = keyed
	m.mu.Unlock()
	m.ExpireDue(ctx)
	return nil
}

// maxRecover bounds the executing holds one Recover looks at (a crash
// leaves at most the calls that were in flight).
const maxRecover = 1 << 20

// Run re-sends what Recover left to reconcile (in the background), listens
// for hold changes made by other gateways on a shared store, and expires
// holds as they come due, until ctx ends.
func (m *Manager) Run(ctx context.Context) {
	m.startReconcile(ctx)
	// A shared store: holds change on other replicas too. Their
	// notifications wake this replica's waiters and feed its live queue;
	// after a lost connection every waiter re-checks its hold.
	go m.o.Store.ListenHolds(ctx, func(id string) { m.remoteChanged(ctx, id) }, m.wakeAll)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.ExpireDue(ctx)
		}
	}
}

// startReconcile starts one goroutine per hold Recover queued and returns
// at once: the gateway serves while the re-sends wait for their upstreams.
func (m *Manager) startReconcile(ctx context.Context) {
	m.mu.Lock()
	ids := m.reconcile
	m.reconcile = nil
	m.mu.Unlock()
	// Like an approval: once started, a re-send is finished (recorded)
	// even if the gateway is shutting down; the upstream timeout bounds it.
	ctx = context.WithoutCancel(ctx)
	for _, id := range ids {
		if !m.claim(id) {
			continue
		}
		go func() {
			defer m.unclaim(id)
			m.reconcileHold(ctx, id)
		}()
	}
}

// claim marks id as being re-sent by this process; false if it already is.
//
// This makes a re-send unique per hold per process only. Another process
// (the gateway restarted again while a re-send was in flight: the hold is
// still executing, so the next start re-sends it too) may send it again,
// possibly while the old connection is still open at the upstream; that
// is harmless because every send carries the same idempotency key, and
// the upstream answers a repeated key with its first reply.
func (m *Manager) claim(id string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, busy := m.inflight[id]; busy {
		return false
	}
	m.inflight[id] = struct{}{}
	return true
}

func (m *Manager) unclaim(id string) {
	m.mu.Lock()
	delete(m.inflight, id)
	m.mu.Unlock()
}

// reconcileHold re-sends one idempotency-keyed hold that a crash left
// executing, through Execute (policy evaluated again, credential attached,
// the same key), once. An HTTP answer finishes it like an approval's
// execution (hold_executed, reconciled=true); no answer (not sent because
// policy, session or credential now refuse it, network error, timeout)
// makes it outcome_unknown, audited: the first send may have been applied,
// so only a person can tell. It is never retried in a loop.
func (m *Manager) reconcileHold(ctx context.Context, id string) {
	h, err := m.get(ctx, id)
	if err != nil {
		m.log.Error("holds: reconcile: the hold cannot be read; it stays executing until the next start", "hold", id, "err", err)
		return
	}
	if h.Status != Running || h.IdempotencyHeader == "" {
		return // recorded meanwhile (or never re-sendable)
	}
	res, ok := m.o.Execute(ctx, h)
	if !res.Answered {
		if _, err := m.unknown(ctx, h, map[string]any{"reconciled": true, "reason": "the re-send got no answer from the upstream"}); err != nil {
			m.log.Error("holds: reconcile", "hold", id, "err", err)
		}
		return
	}
	status, kind, res := m.outcome(h, res, ok)
	if _, err := m.finish(ctx, h, status, res, kind, map[string]any{"reconciled": true}); err != nil {
		m.log.Error("holds: reconcile", "hold", id, "err", err)
	}
}

// unknown moves an executing hold to outcome_unknown (audited
// hold_outcome_unknown with fields).
func (m *Manager) unknown(ctx context.Context, h Hold, fields map[string]any) (Hold, error) {
	ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Running), string(Unknown), nil)
	if err != nil {
		return h, fmt.Errorf("holds: record outcome unknown: %w", err)
	}
	if !ok {
		return h, nil
	}
	h.Status = Unknown
	if err := m.o.Audit(ctx, "hold_outcome_unknown", h, fields); err != nil {
		m.log.Error("holds: outcome unknown not audited", "hold", h.ID, "err", err)
	}
	m.log.Warn("holds: the re-sent approved call got no answer; its outcome is unknown and it is not sent again", "hold", h.ID)
	m.publish(h, "outcome_unknown")
	return h, nil
}

// refusalBody is the JSON of a refusal as the agent sees it.
func refusalBody(code, msg, rid string) []byte {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg, "request_id": rid}})
	return b
}
