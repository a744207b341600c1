package vault

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// leaseKey names one dynamic secret: a session's credential from one path.
// Sessions never share a lease, so ending one revokes only its own.
type leaseKey struct{ session, path string }

// lease is a dynamic secret the gateway holds for a session.
type lease struct {
	key       leaseKey
	id        string
	data      map[string]Secret
	duration  time.Duration // as last granted
	expires   time.Time
	renewable bool
	lastUsed  time.Time
	next      time.Time     // next renewal attempt
	stop      chan struct{} // closed when the lease leaves the table
}

// renewMargin: a lease this close to its end is not handed out (the call
// might outlive it); a fresh one is fetched instead.
const renewMargin = 2 * time.Second

// Dynamic returns the fields of the leased secret at path (for example
// database/creds/readonly) for session, creating the lease on first use.
// The lease is renewed at about two thirds of its duration while it is used
// and revoked by EndSession, by Close, or after LeaseIdle without use.
func (v *Vault) Dynamic(ctx context.Context, session, path string) (map[string]Secret, error) {
	k := leaseKey{session, path}
	now := time.Now()
	v.mu.Lock()
	if l := v.leases[k]; l != nil && now.Add(renewMargin).Before(l.expires) {
		l.lastUsed = now
		d := l.data
		v.mu.Unlock()
		return d, nil
	}
	v.mu.Unlock()
	r, err, _ := v.sf.Do("lease\x00"+session+"\x00"+path, func() (any, error) {
		sec, err := v.read(ctx, path)
		if err != nil {
			return nil, err
		}
		if sec == nil {
			return nil, fmt.Errorf("vault: %s: %w", path, ErrNotFound)
		}
		if sec.LeaseID == "" || sec.LeaseDuration <= 0 {
			return nil, fmt.Errorf("vault: %s returned no lease: not a dynamic secret (use kv for static values)", path)
		}
		l := &lease{
			key: k, id: sec.LeaseID, data: map[string]Secret{},
			duration:  time.Duration(sec.LeaseDuration) * time.Second,
			renewable: sec.Renewable, lastUsed: time.Now(), stop: make(chan struct{}),
		}
		l.expires = l.lastUsed.Add(l.duration)
		l.next = l.expires.Add(-l.duration / 3)
		for f, val := range sec.Data {
			if s, ok := val.(string); ok && s != "" {
				l.data[f] = NewSecret([]byte(s)).WithLease(l.id)
			}
		}
		v.mu.Lock()
		old := v.leases[k]
		select {
		case <-v.stop:
			v.mu.Unlock()
			_ = v.revokeLease(context.WithoutCancel(ctx), l)
			return nil, fmt.Errorf("vault: closed: %w", ErrUnavailable)
		default:
		}
		v.leases[k] = l
		if old != nil {
			close(old.stop)
		}
		v.mu.Unlock()
		if old != nil {
			// Nearly expired and replaced: let it go now.
			v.queueRevoke(old)
		}
		v.wg.Add(1)
		go v.keepLease(l)
		v.log.Info("vault: lease created", "path", path, "session", session, "lease_id", l.id, "ttl", l.duration, "renewable", l.renewable)
		return l.data, nil
	})
	if err != nil {
		return nil, err
	}
	return r.(map[string]Secret), nil
}

// keepLease renews l at two thirds of each grant while it is in use; an
// idle lease is revoked instead, and one that can no longer be renewed is
// dropped when it expires (a later call fetches a new one).
func (v *Vault) keepLease(l *lease) {
	defer v.wg.Done()
	for {
		v.mu.Lock()
		wait := time.Until(l.next)
		v.mu.Unlock()
		if wait < 0 {
			wait = 0
		}
		t := time.NewTimer(wait)
		select {
		case <-v.stop:
			t.Stop()
			return
		case <-l.stop:
			t.Stop()
			return
		case <-t.C:
		}
		v.mu.Lock()
		idle := time.Since(l.lastUsed) >= v.cfg.LeaseIdle
		expired := !time.Now().Before(l.expires)
		v.mu.Unlock()
		if idle || expired || !l.renewable {
			if v.forget(l) {
				if expired {
					v.log.Info("vault: lease expired", "path", l.key.path, "session", l.key.session, "lease_id", l.id)
				} else {
					v.queueRevoke(l)
				}
			}
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), v.cfg.Timeout)
		sec, err := v.write(ctx, "sys/leases/renew", map[string]any{"lease_id": l.id, "increment": int(l.duration / time.Second)})
		cancel()
		v.mu.Lock()
		if err != nil || sec == nil {
			// Try again after half of what is left; the lease keeps
			// serving until it expires, then it is dropped.
			left := time.Until(l.expires)
			l.next = time.Now().Add(max(left/2, time.Second))
			v.mu.Unlock()
			v.log.Warn("vault: lease renewal failed", "lease_id", l.id, "left", left.Round(time.Second), "err", err)
			continue
		}
		got := time.Duration(sec.LeaseDuration) * time.Second
		l.expires = time.Now().Add(got)
		if got > 0 {
			l.duration = got
		}
		l.next = l.expires.Add(-l.duration / 3)
		v.mu.Unlock()
	}
}

// forget removes l from the table if it is still there.
func (v *Vault) forget(l *lease) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.leases[l.key] != l {
		return false
	}
	delete(v.leases, l.key)
	close(l.stop)
	return true
}

// queueRevoke revokes l now, or later if Vault does not answer.
func (v *Vault) queueRevoke(l *lease) {
	ctx, cancel := context.WithTimeout(context.Background(), v.cfg.Timeout)
	defer cancel()
	if err := v.revokeLease(ctx, l); err != nil {
		v.mu.Lock()
		v.revoke = append(v.revoke, l)
		v.mu.Unlock()
		v.log.Warn("vault: lease revocation failed; retrying", "lease_id", l.id, "err", err)
	}
}

func (v *Vault) revokeLease(ctx context.Context, l *lease) error {
	if _, err := v.write(ctx, "sys/leases/revoke", map[string]any{"lease_id": l.id}); err != nil {
		return err
	}
	v.log.Info("vault: lease revoked", "path", l.key.path, "session", l.key.session, "lease_id", l.id)
	return nil
}

// retryRevocations retries failed revocations; a lease past its end needs
// none (Vault has already revoked it).
func (v *Vault) retryRevocations() {
	v.mu.Lock()
	pending := v.revoke
	v.revoke = nil
	v.mu.Unlock()
	var again []*lease
	for _, l := range pending {
		if time.Now().After(l.expires) {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), v.cfg.Timeout)
		if err := v.revokeLease(ctx, l); err != nil {
			again = append(again, l)
		}
		cancel()
	}
	if len(again) > 0 {
		v.mu.Lock()
		v.revoke = append(v.revoke, again...)
		v.mu.Unlock()
	}
}

// EndSession revokes every lease the session holds. It is idempotent. A
// revocation Vault does not accept now is retried in the background until
// the lease would have ended anyway, and reported in the error.
func (v *Vault) EndSession(ctx context.Context, session string) error {
	v.mu.Lock()
	var mine []*lease
	for k, l := range v.leases {
		if k.session == session {
			mine = append(mine, l)
			delete(v.leases, k)
			close(l.stop)
		}
	}
	v.mu.Unlock()
	sort.Slice(mine, func(i, j int) bool { return mine[i].key.path < mine[j].key.path })
	var errs []error
	for _, l := range mine {
		if err := v.revokeLease(ctx, l); err != nil {
			v.mu.Lock()
			v.revoke = append(v.revoke, l)
			v.mu.Unlock()
			errs = append(errs, err)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("vault: end session %q: %d of %d revocations failed (retrying): %w", session, len(errs), len(mine), errors.Join(errs...))
	}
	return nil
}

// Leases lists the lease IDs held for session (tests and the admin view).
func (v *Vault) Leases(session string) []string {
	v.mu.Lock()
	defer v.mu.Unlock()
	var ids []string
	for k, l := range v.leases {
		if k.session == session {
			ids = append(ids, l.id)
		}
	}
	sort.Strings(ids)
	return ids
}
