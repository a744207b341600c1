package store

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
	"time"
)

func uiHash(id string) string {
	s := sha256.Sum256([]byte(id))
	return hex.EncodeToString(s[:])
}

// TestUISessions: a session is found while live and refused (and its row
// deleted) once past its absolute end or its idle timeout, each read from
// the row; a use moves last_seen on, never back; deleting ends it.
func TestUISessions(t *testing.T) {
	eachBackend(t, func(t *testing.T) {
		s := openTemp(t)
		ctx := context.Background()
		t0 := time.Unix(1_800_000_000, 0).UTC()
		put := func(id string, at time.Time) {
			t.Helper()
			err := s.PutUISession(ctx, UISession{IDHash: uiHash(id), Person: "bob", Groups: []string{"finance"}, Method: "password",
				Created: at, Expires: at.Add(8 * time.Hour), Idle: 30 * time.Minute})
			if err != nil {
				t.Fatal(err)
			}
		}
		rows := func() int {
			t.Helper()
			var n int
			if err := s.db.queryRow(ctx, `SELECT COUNT(*) FROM ui_sessions`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		put("a", t0)
		u, err := s.TouchUISession(ctx, uiHash("a"), t0.Add(29*time.Minute))
		if err != nil || u.Person != "bob" || !slices.Equal(u.Groups, []string{"finance"}) || u.Method != "password" ||
			!u.Created.Equal(t0) || !u.LastSeen.Equal(t0.Add(29*time.Minute)) || u.Idle != 30*time.Minute {
			t.Fatalf("touch a live session: %+v, %v", u, err)
		}
		// A replica whose clock is behind does not move last_seen back.
		if u, err = s.TouchUISession(ctx, uiHash("a"), t0.Add(10*time.Minute)); err != nil || !u.LastSeen.Equal(t0.Add(29*time.Minute)) {
			t.Fatalf("touch with an earlier clock: %+v, %v; want last_seen kept", u, err)
		}
		if ok, err := s.UISessionAlive(ctx, uiHash("a"), t0.Add(58*time.Minute)); !ok || err != nil {
			t.Fatalf("alive 29m after its last use: %v %v", ok, err)
		}
		// Idle: 30 min after the last use, refused and gone.
		if ok, err := s.UISessionAlive(ctx, uiHash("a"), t0.Add(59*time.Minute)); ok || err != nil {
			t.Fatalf("alive 30m idle: %v %v; want false", ok, err)
		}
		if _, err := s.TouchUISession(ctx, uiHash("a"), t0.Add(59*time.Minute)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("touch 30m idle: %v; want ErrNotFound", err)
		}
		if n := rows(); n != 0 {
			t.Fatalf("%d rows after the idle session was refused; want it deleted", n)
		}
		// Absolute end: used every 20 minutes, still refused at 8h.
		put("b", t0)
		at := t0
		for at.Before(t0.Add(8*time.Hour - 20*time.Minute)) {
			at = at.Add(20 * time.Minute)
			if _, err := s.TouchUISession(ctx, uiHash("b"), at); err != nil {
				t.Fatalf("touch at %s: %v", at.Sub(t0), err)
			}
		}
		if _, err := s.TouchUISession(ctx, uiHash("b"), t0.Add(8*time.Hour)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("touch at 8h: %v; want ErrNotFound", err)
		}
		// Sign-out.
		put("c", t0)
		if err := s.DeleteUISession(ctx, uiHash("c")); err != nil {
			t.Fatal(err)
		}
		if _, err := s.TouchUISession(ctx, uiHash("c"), t0.Add(time.Minute)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("touch a deleted session: %v", err)
		}
		// A new session sweeps the ended ones.
		put("d", t0)
		put("e", t0.Add(9*time.Hour))
		if n := rows(); n != 1 {
			t.Fatalf("%d rows after a put 9h later; want the ended one swept", n)
		}
		// Refused input.
		if err := s.PutUISession(ctx, UISession{IDHash: "raw-id", Person: "bob", Method: "password", Created: t0, Expires: t0.Add(time.Hour), Idle: time.Minute}); err == nil {
			t.Fatal("a session keyed by something other than a SHA-256 hex was stored")
		}
	})
}
