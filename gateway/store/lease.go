package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// A hold in status "executing" is leased to the gateway process sending
// it (THREATS G20). The process renews the lease while it sends; a
// replica killed mid-send stops renewing, and once the lease has passed
// another replica sharing the database takes the hold over
// (TakeOverHolds) and reconciles it as a restart would: a re-send with
// the same idempotency key, or outcome_unknown. Taking over is a
// conditional update on the hold's status and version, so of any number
// of replicas looking at once exactly one takes each hold.
//
// Lease times are the database server's clock on PostgreSQL (replicas'
// clocks may differ; the server's is the one they share) and the
// gateway's own on SQLite, whose file one gateway owns.

const executing = "executing"

// newLeaseOwner is this Store's lease_owner: the replica id, so an
// operator sees who holds a lease, and a token of this process, so a
// restart under the same id does not mistake its predecessor's leases
// for its own.
func newLeaseOwner(replica string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	if replica == "" {
		replica = "gateway"
	}
	return replica + "/" + hex.EncodeToString(b[:])
}

// LeaseOwner is what this Store writes into the leases it takes.
func (s *Store) LeaseOwner() string { return s.leaseOwner }

// Shared says whether other gateway processes may change the state too
// (PostgreSQL): a hold executing here may then be another replica's.
func (s *Store) Shared() bool { return s.b.shared() }

// clock is an SQL expression for "now" in Unix nanoseconds: the server's
// clock on PostgreSQL; on SQLite the Store's (a literal, so that tests
// setting s.now see it).
func (s *Store) clock() string {
	if s.b.Kind() == Postgres {
		return `(extract(epoch from clock_timestamp()) * 1e9)::bigint`
	}
	return strconv.FormatInt(s.now().UnixNano(), 10)
}

// RenewLeases moves on by d the leases this Store holds on ids, and
// returns the ids whose lease it no longer holds (taken over by another
// replica after it passed, or no longer executing).
func (s *Store) RenewLeases(ctx context.Context, ids []string, d time.Duration) (lost []string, err error) {
	if len(ids) == 0 {
		return nil, nil
	}
	kept := map[string]bool{}
	args := append([]any{d.Nanoseconds(), s.leaseOwner, executing}, anys(ids)...)
	err = s.db.each(ctx, `UPDATE holds SET lease_expires = `+s.clock()+` + ? WHERE lease_owner = ? AND status = ? AND id IN (`+
		strings.TrimSuffix(strings.Repeat("?, ", len(ids)), ", ")+`) RETURNING id`, args, func(sc scanner) error {
		var id string
		if err := sc.Scan(&id); err != nil {
			return err
		}
		kept[id] = true
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: renew leases: %w", err)
	}
	for _, id := range ids {
		if !kept[id] {
			lost = append(lost, id)
		}
	}
	return lost, nil
}

// TakenHold is an executing hold TakeOverHolds leased to this Store.
type TakenHold struct {
	HoldRow
	// From is the lease owner it was taken from ("" for a hold stored
	// before leases existed); Expired is when that lease ran out (zero:
	// taken at start without waiting, see TakeOverHolds).
	From    string
	Expired time.Time
}

// TakeOverHolds leases to this Store, for d, every executing hold whose
// lease has passed, and returns them (at most limit). With all, it takes
// every executing hold whatever its lease: only for a gateway that knows
// no other process sends holds from this database (SQLite: it holds the
// file's lock, so a lease it finds is a dead predecessor's).
//
// Each take is conditional on the hold's status and version as read:
// of any number of replicas taking over at once, one takes each hold.
func (s *Store) TakeOverHolds(ctx context.Context, d time.Duration, all bool, limit int) ([]TakenHold, error) {
	if all && s.b.shared() {
		return nil, errors.New("store: bug(): taking over every executing hold of a shared store")
	}
	type cand struct {
		id, owner        string
		version, expires int64
	}
	var cands []cand
	q := `SELECT id, lease_owner, lease_expires, version FROM holds WHERE status = ?`
	if !all {
		q += ` AND lease_expires <= ` + s.clock()
	}
	err := s.db.each(ctx, q+` ORDER BY lease_expires LIMIT ?`, []any{executing, limit}, func(sc scanner) error {
		var c cand
		if err := sc.Scan(&c.id, &c.owner, &c.expires, &c.version); err != nil {
			return err
		}
		cands = append(cands, c)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("store: take over holds: %w", err)
	}
	var out []TakenHold
	for _, c := range cands {
		n, err := s.db.exec(ctx, `UPDATE holds SET lease_owner = ?, lease_expires = `+s.clock()+` + ?, version = version + 1
			WHERE id = ? AND status = ? AND version = ?`, s.leaseOwner, d.Nanoseconds(), c.id, executing, c.version)
		if err != nil {
			return out, fmt.Errorf("store: take over hold %s: %w", c.id, err)
		}
		if n != 1 {
			continue // another replica took it, or it finished meanwhile
		}
		h, err := s.GetHold(ctx, c.id)
		if err != nil {
			return out, fmt.Errorf("store: take over hold %s: %w", c.id, err)
		}
		t := TakenHold{HoldRow: h, From: c.owner}
		if !all && c.expires > 0 {
			t.Expired = time.Unix(0, c.expires).UTC()
		}
		out = append(out, t)
	}
	return out, nil
}

// HoldLease returns the lease on hold id: its owner and expiry (zero:
// never leased).
func (s *Store) HoldLease(ctx context.Context, id string) (owner string, expires time.Time, err error) {
	var ns int64
	if err := s.db.queryRow(ctx, `SELECT lease_owner, lease_expires FROM holds WHERE id = ?`, id).Scan(&owner, &ns); err != nil {
		return "", time.Time{}, fmt.Errorf("store: hold lease: %w", err)
	}
	if ns != 0 {
		expires = time.Unix(0, ns).UTC()
	}
	return owner, expires, nil
}
