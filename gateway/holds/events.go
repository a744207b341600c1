package holds

import (
	"context"
	"time"
)

// Wait returns the hold once it is terminal (executed, denied, expired,
// failed, outcome unknown) or, for a deferred hold, approved (its request
// may then be released), or when ctx ends, whichever is first; then it
// returns the hold as it is and no error.
func (m *Manager) Wait(ctx context.Context, id string) (Hold, error) {
	// Reads are not cut short by ctx: when the wait ends the caller still
	// gets the hold's state.
	rctx := context.WithoutCancel(ctx)
	for {
		ch := m.waiter(id)
		h, err := m.Get(rctx, id)
		if err != nil || h.Status.Terminal() || (h.Deferred && h.Status == Approved) {
			return h, err
		}
		d := time.Hour
		if h.Status == Pending {
			d = h.Expires.Sub(m.now()) + time.Millisecond
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return m.Get(rctx, id)
		case <-ch:
		case <-t.C:
		}
		t.Stop()
	}
}

func (m *Manager) waiter(id string) chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch, ok := m.waiters[id]
	if !ok {
		ch = make(chan struct{})
		m.waiters[id] = ch
	}
	return ch
}

// Subscribe returns the stream of hold changes; it is closed when ctx
// ends. A subscriber that does not keep up misses events (never blocks
// the gateway) and should re-list.
func (m *Manager) Subscribe(ctx context.Context) <-chan Event {
	ch := make(chan Event, 64)
	m.mu.Lock()
	m.subs[ch] = struct{}{}
	m.mu.Unlock()
	go func() {
		<-ctx.Done()
		m.mu.Lock()
		delete(m.subs, ch)
		close(ch)
		m.mu.Unlock()
	}()
	return ch
}

// remoteChanged handles another replica's change to hold id: when
// something here waits on it or watches the queue, the hold is read and
// published as if changed here.
func (m *Manager) remoteChanged(ctx context.Context, id string) {
	m.mu.Lock()
	_, waiting := m.waiters[id]
	watched := len(m.subs) > 0
	m.mu.Unlock()
	if !waiting && !watched {
		return
	}
	h, err := m.get(ctx, id)
	if err != nil {
		m.wake(id) // the waiter reads it again itself
		return
	}
	m.publish(h, eventKind(h.Status))
}

// eventKind is the Event.Kind a hold in status st was last changed by.
func eventKind(st Status) string {
	switch st {
	case Pending:
		return "created"
	case Running:
		return "approved"
	}
	return string(st) // executed, denied, expired, failed, outcome_unknown
}

// wake releases whoever waits on id, without an event.
func (m *Manager) wake(id string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch, ok := m.waiters[id]; ok {
		close(ch)
		delete(m.waiters, id)
	}
}

// wakeAll releases every waiter: each reads its hold again. Called after
// the notification connection was lost, when changes may have been missed.
func (m *Manager) wakeAll() {
	m.resyncs.Add(1)
	m.mu.Lock()
	defer m.mu.Unlock()
	for id, ch := range m.waiters {
		close(ch)
		delete(m.waiters, id)
	}
}

func (m *Manager) publish(h Hold, kind string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if ch, ok := m.waiters[h.ID]; ok {
		close(ch)
		delete(m.waiters, h.ID)
	}
	for s := range m.subs {
		select {
		case s <- Event{Hold: h, Kind: kind}:
		default:
		}
	}
}

// ExpireDue expires every pending hold past its expiry (audited
// "hold_expired"). Errors are logged: the next call tries again.
func (m *Manager) ExpireDue(ctx context.Context) {
	ids, err := m.o.Store.ExpireHolds(ctx, m.now().UTC())
	if err != nil {
		m.log.Warn("holds: expiry", "err", err)
		return
	}
	for _, id := range ids {
		h, err := m.get(ctx, id)
		if err != nil {
			continue
		}
		if err := m.o.Audit(ctx, "hold_expired", h, nil); err != nil {
			m.log.Error("holds: expiry not audited", "hold", id, "err", err)
		}
		m.publish(h, "expired")
	}
}
