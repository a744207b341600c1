package holds

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluice-gw/sluice/gateway/store"
)

// Grant bounds: an "always allow" lasts DefaultGrantTTL unless the
// approver asks for another duration, and never more than MaxGrantTTL.
const (
	DefaultGrantTTL = 8 * time.Hour
	MaxGrantTTL     = 24 * time.Hour
	// MaxGrantUses bounds a grant's max_uses (0 is no limit but its
	// validity window).
	MaxGrantUses = 10000
)

// Errors of the grant calls.
var (
	ErrGrantNotFound = errors.New("holds: no such grant")                                          // 404
	ErrGrantRevoked  = errors.New("holds: the grant is already revoked")                           // 409
	ErrGrantTTL      = fmt.Errorf("holds: a grant lasts more than 0 and at most %s", MaxGrantTTL)  // 400
	ErrGrantUses     = fmt.Errorf("holds: a grant's max_uses is 0 (no limit) to %d", MaxGrantUses) // 400
)

// Grant is an approver's "always allow this exact call": a later ask
// decision for the same agent, user, tool and canonical request hash is
// executed without a new hold until Expires (THREATS E7). Any other
// arguments, user or agent is a different key and asks again.
type Grant struct {
	ID     string `json:"id"`
	Agent  string `json:"agent"`
	User   string `json:"user"`
	Tool   string `json:"tool"`
	SHA256 string `json:"sha256"` // Request.Hash() of the approved hold
	Hold   string `json:"hold"`   // the hold it was granted from
	By     string `json:"granted_by"`
	// ByGroups are the granter's groups when granting: a grant is used only
	// while the granter could still approve the call (by name or group).
	ByGroups  []string  `json:"granted_by_groups,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Created   time.Time `json:"created"`
	Expires   time.Time `json:"expires"`
	Revoked   time.Time `json:"revoked,omitzero"`
	RevokedBy string    `json:"revoked_by,omitempty"`
	// MaxUses is how many calls the grant lets through (0: any number
	// until Expires); Uses how many it has, UsesLeft what remains (absent
	// without a limit).
	MaxUses  int  `json:"max_uses"`
	Uses     int  `json:"uses"`
	UsesLeft *int `json:"uses_left,omitempty"`
}

// Active says whether g can be used at now.
func (g Grant) Active(now time.Time) bool {
	return g.Revoked.IsZero() && now.Before(g.Expires) && (g.MaxUses == 0 || g.Uses < g.MaxUses)
}

// GrantTerms are what an approver sets on an "always allow": how long it
// lasts (0 is DefaultGrantTTL, at most MaxGrantTTL) and how many calls it
// lets through (0: no limit, at most MaxGrantUses).
type GrantTerms struct {
	TTL     time.Duration
	MaxUses int
}

// GrantKey is what a grant is bound to.
type GrantKey struct {
	Agent, User, Tool, SHA256 string
}

type grantDoc struct {
	ByGroups []string `json:"by_groups,omitempty"`
	Reason   string   `json:"reason,omitempty"`
}

func grantFromRow(r store.GrantRow) (Grant, error) {
	var d grantDoc
	if err := json.Unmarshal(r.Doc, &d); err != nil {
		return Grant{}, fmt.Errorf("holds: grant %s: stored document: %w", r.ID, err)
	}
	g := Grant{ID: r.ID, Agent: r.Agent, User: r.User, Tool: r.Tool, SHA256: r.SHA256, Hold: r.Hold, By: r.GrantedBy,
		ByGroups: d.ByGroups, Reason: d.Reason, Created: r.Created, Expires: r.Expires, Revoked: r.Revoked, RevokedBy: r.RevokedBy,
		MaxUses: r.MaxUses, Uses: r.Uses}
	g.setLeft()
	return g, nil
}

func (g *Grant) setLeft() {
	g.UsesLeft = nil
	if g.MaxUses > 0 {
		left := max(0, g.MaxUses-g.Uses)
		g.UsesLeft = &left
	}
}

// ApproveAlways is Approve that also grants "always allow this exact
// call" for ttl (0 is DefaultGrantTTL; more than MaxGrantTTL is
// ErrGrantTTL). The same rules decide who may: never the person the call
// is made for. The grant is stored in the same transaction as the
// approval, so it exists only if this approval won.
func (m *Manager) ApproveAlways(ctx context.Context, id string, p Person, reason string, ttl time.Duration) (Hold, Grant, error) {
	return m.ApproveGrant(ctx, id, p, reason, GrantTerms{TTL: ttl})
}

// ApproveGrant is ApproveAlways with a use limit as well: a grant with
// MaxUses n lets exactly n calls through (then the policy decides again,
// and an ask asks again), however many arrive at once.
func (m *Manager) ApproveGrant(ctx context.Context, id string, p Person, reason string, t GrantTerms) (Hold, Grant, error) {
	ttl := t.TTL
	if ttl == 0 {
		ttl = DefaultGrantTTL
	}
	if ttl < 0 || ttl > MaxGrantTTL {
		return Hold{}, Grant{}, ErrGrantTTL
	}
	if t.MaxUses < 0 || t.MaxUses > MaxGrantUses {
		return Hold{}, Grant{}, ErrGrantUses
	}
	g := Grant{ID: newID(), By: p.Name, ByGroups: slices.Clone(p.Groups), Reason: reason, MaxUses: t.MaxUses}
	g.setLeft()
	h, err := m.approve(ctx, id, p, reason, &g, ttl)
	if err != nil {
		return h, Grant{}, err
	}
	return h, g, nil
}

// MatchGrant returns an active grant for exactly key whose granter could
// still approve a call that the current decision asks approvers to decide
// (a grant outlives no change of who may approve), having taken one use
// of it (Store.UseGrant: a grant another call used up meanwhile is passed
// over), and ok false when there is none.
func (m *Manager) MatchGrant(ctx context.Context, key GrantKey, approvers []string) (Grant, bool, error) {
	rows, err := m.o.Store.MatchGrants(ctx, key.Agent, key.User, key.Tool, key.SHA256, m.now().UTC())
	if err != nil {
		return Grant{}, false, fmt.Errorf("holds: match grant: %w", err)
	}
	for _, r := range rows {
		g, err := grantFromRow(r)
		if err != nil {
			return Grant{}, false, err
		}
		// The key is compared again here, not only in SQL: a grant is
		// never used for anything but its own exact key.
		if g.Agent != key.Agent || g.User != key.User || g.Tool != key.Tool || g.SHA256 != key.SHA256 {
			return Grant{}, false, fmt.Errorf("bug: holds: grant %s matched another key", g.ID)
		}
		probe := Hold{Caller: Caller{Agent: key.Agent, User: key.User}, Approvers: approvers}
		if m.CanApprove(probe, Person{Name: g.By, Groups: g.ByGroups}) != nil {
			continue
		}
		used, err := m.o.Store.UseGrant(ctx, g.ID, m.now().UTC())
		if err != nil {
			return Grant{}, false, fmt.Errorf("holds: use grant: %w", err)
		}
		if used {
			g.Uses++
			g.setLeft()
			return g, true, nil
		}
	}
	return Grant{}, false, nil
}

// Grants lists grants, newest first: the active ones, or with all every
// grant including expired and revoked ones.
func (m *Manager) Grants(ctx context.Context, all bool, limit int) ([]Grant, error) {
	rows, err := m.o.Store.ListGrants(ctx, all, m.now().UTC(), limit)
	if err != nil {
		return nil, fmt.Errorf("holds: list grants: %w", err)
	}
	out := make([]Grant, 0, len(rows))
	for _, r := range rows {
		g, err := grantFromRow(r)
		if err != nil {
			return nil, err
		}
		out = append(out, g)
	}
	return out, nil
}

// Grant returns one grant.
func (m *Manager) Grant(ctx context.Context, id string) (Grant, error) {
	r, err := m.o.Store.GetGrant(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return Grant{}, ErrGrantNotFound
	}
	if err != nil {
		return Grant{}, fmt.Errorf("holds: get grant: %w", err)
	}
	return grantFromRow(r)
}

// RevokeGrant revokes a grant for p (any authenticated approver may:
// revoking only takes a permission away). It is audited "grant_revoked";
// a revocation that cannot be audited still stands (it only removes a
// permission) and the error is logged.
func (m *Manager) RevokeGrant(ctx context.Context, id string, p Person) (Grant, error) {
	g, err := m.Grant(ctx, id)
	if err != nil {
		return Grant{}, err
	}
	now := m.now().UTC()
	ok, err := m.o.Store.RevokeGrant(ctx, id, p.Name, now)
	if err != nil {
		return g, fmt.Errorf("holds: revoke grant: %w", err)
	}
	if !ok {
		return g, ErrGrantRevoked
	}
	g.Revoked, g.RevokedBy = now, p.Name
	h := Hold{ID: g.Hold, Tool: g.Tool, SHA256: g.SHA256, Caller: Caller{Agent: g.Agent, User: g.User}, RequestID: "grant-" + g.ID}
	if err := m.o.Audit(context.WithoutCancel(ctx), "grant_revoked", h, map[string]any{"grant": g.ID, "by": p.Name}); err != nil {
		m.log.Error("holds: grant revocation not audited", "grant", id, "err", err)
	}
	return g, nil
}
