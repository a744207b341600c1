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
// On a store one gateway owns (SQLite) that is every executing hold. On a
// shared store an executing hold may be another live replica's: Recover
// takes only those whose lease has passed, and Run keeps taking them over
// as leases pass (THREATS G20; see adopt).
//
// Pending holds stay pending (or expire). Recover does not wait for any
// upstream.
func (m *Manager) Recover(ctx context.Context) error {
	taken, err := m.o.Store.TakeOverHolds(ctx, m.o.Lease, !m.o.Store.Shared(), maxRecover)
	if err != nil {
		return fmt.Errorf("holds: recover: %w", err)
	}
	keyed, err := m.adopt(ctx, taken)
	if err != nil {
		return fmt.Errorf("holds: recover: %w", err)
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

// adopt handles executing holds whose sender is gone, now leased to this
// process: an idempotency-keyed one is audited hold_reconciling and
// returned, claimed, for a re-send; any other becomes outcome_unknown,
// audited with the reason. A hold taken from another replica's lease
// names that lease's owner and expiry in the records (taken_over_from,
// lease_expired). A hold this process is itself still sending (its own
// lease passed while the store was unreachable) is left to that send.
func (m *Manager) adopt(ctx context.Context, taken []store.TakenHold) ([]string, error) {
	var keyed []string
	for _, t := range taken {
		h, err := fromRow(t.HoldRow)
		if err != nil {
			return keyed, err
		}
		if !m.claim(h.ID) {
			continue // being sent here: the lease is this process's again
		}
		fields := map[string]any{}
		stopped := "the gateway stopped"
		if m.o.Store.Shared() && t.From != "" {
			fields["taken_over_from"] = t.From
			fields["lease_expired"] = t.Expired.Format(time.RFC3339Nano)
			stopped = "the replica sending it (" + t.From + ") stopped renewing its lease"
		}
		if h.IdempotencyHeader != "" {
			from := "hold_id"
			if http.Header(h.Request.Headers).Get(h.IdempotencyHeader) != "" {
				from = "arguments"
			}
			// The header's name and where its value comes from; the value
			// itself is the hold's ID or the agent's (in the stored request).
			fields["idempotency_header"], fields["idempotency_key_from"] = h.IdempotencyHeader, from
			if err := m.o.Audit(ctx, "hold_reconciling", h, fields); err != nil {
				m.unclaim(h.ID)
				return keyed, fmt.Errorf("audit: %w", err)
			}
			m.log.Warn("holds: "+stopped+" while this approved call was being sent; it is idempotency-keyed and is re-sent once with the same key", "hold", h.ID)
			keyed = append(keyed, h.ID)
			continue
		}
		ok, err := m.o.Store.FinishHold(ctx, h.ID, string(Running), string(Unknown), nil)
		m.unclaim(h.ID)
		if err != nil {
			return keyed, err
		}
		if !ok {
			continue // no longer executing: someone else recorded it
		}
		h.Status = Unknown
		fields["reason"] = stopped + " while it was being sent; its operation has no idempotency key, so it is not re-sent"
		if err := m.o.Audit(ctx, "hold_outcome_unknown", h, fields); err != nil {
			return keyed, fmt.Errorf("audit: %w", err)
		}
		m.log.Warn("holds: "+stopped+" while this approved call was being sent; its outcome is unknown and it is not re-sent", "hold", h.ID)
		m.publish(h, "outcome_unknown")
	}
	return keyed, nil
}

// Run re-sends what Recover left to reconcile (in the background), listens
// for hold changes made by other gateways on a shared store, and expires
// holds as they come due, until ctx ends. On a shared store it also
// renews the leases of the holds this process sends and takes over the
// holds whose lease has passed (THREATS G20).
func (m *Manager) Run(ctx context.Context) {
	m.startReconcile(ctx, m.takeReconcile())
	// A shared store: holds change on other replicas too. Their
	// notifications wake this replica's waiters and feed its live queue;
	// after a lost connection every waiter re-checks its hold.
	go m.o.Store.ListenHolds(ctx, func(id string) { m.remoteChanged(ctx, id) }, m.wakeAll)
	if m.o.Store.Shared() {
		go m.keepLeases(ctx)
	}
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			m.ExpireDue(ctx)
			if m.o.Store.Shared() {
				m.takeOver(ctx)
			}
		}
	}
}

func (m *Manager) takeReconcile() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := m.reconcile
	m.reconcile = nil
	return ids
}

// takeOver adopts the executing holds whose lease has passed (another
// replica died, or hung, mid-send) and starts their re-sends.
func (m *Manager) takeOver(ctx context.Context) {
	taken, err := m.o.Store.TakeOverHolds(ctx, m.o.Lease, false, 100)
	if err != nil {
		m.log.Warn("holds: take over expired leases", "err", err)
	}
	keyed, err := m.adopt(ctx, taken)
	if err != nil {
		m.log.Error("holds: take over expired leases", "err", err)
	}
	m.startReconcile(ctx, keyed)
}

// keepLeases renews, every third of the lease, the leases of the holds
// this process sends, until ctx ends. A lease found lost (the store was
// unreachable past the lease, and another replica took the hold over) is
// logged: that replica reconciles the hold, and this send's result is
// recorded only if it still finds the hold executing.
func (m *Manager) keepLeases(ctx context.Context) {
	t := time.NewTicker(m.o.Lease / 3)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		m.mu.Lock()
		ids := make([]string, 0, len(m.inflight))
		for id := range m.inflight {
			ids = append(ids, id)
		}
		m.mu.Unlock()
		lost, err := m.o.Store.RenewLeases(context.WithoutCancel(ctx), ids, m.o.Lease)
		if err != nil {
			m.log.Warn("holds: renew leases", "holds", len(ids), "err", err)
			continue
		}
		for _, id := range lost {
			m.log.Warn("holds: lost the lease on a hold this gateway is sending (another replica may have taken it over)", "hold", id)
		}
	}
}

// startReconcile starts one goroutine per claimed hold in ids (what adopt
// returned) and returns at once: the gateway serves while the re-sends
// wait for their upstreams.
func (m *Manager) startReconcile(ctx context.Context, ids []string) {
	// Like an approval: once started, a re-send is finished (recorded)
	// even if the gateway is shutting down; the upstream timeout bounds it.
	ctx = context.WithoutCancel(ctx)
	for _, id := range ids {
		go func() {
			defer m.unclaim(id)
			m.reconcileHold(ctx, id)
		}()
	}
}

// claim marks id as being sent by this process (an approval's execution
// or a re-send); false if it already is. The leases keepLeases renews
// are those of the claimed holds.
//
// This makes a send unique per hold per process only. Another process
// (a replica that took the hold over after this one's lease passed, or
// this gateway restarted while a re-send was in flight) may send it
// again, possibly while the old connection is still open at the upstream;
// only an idempotency-keyed hold is ever re-sent, and every send carries
// the same key, which the upstream answers with its first reply.
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
