package review

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/holds"
)

// Grants is what the Grants page needs of the holds manager
// (*holds.Manager): the "always allow" grants approvers made, and their
// revocation (audited grant_revoked by the manager). Any signed-in
// approver may revoke, as on the admin API: revoking only takes a
// permission away.
type Grants interface {
	Grants(ctx context.Context, all bool, limit int) ([]holds.Grant, error)
	RevokeGrant(ctx context.Context, id string, by holds.Person) (holds.Grant, error)
}

// grantsShown bounds the page (the newest first, as the store lists them).
const grantsShown = 200

// grantView is one grant as the page shows it.
type grantView struct {
	holds.Grant
	State string // active, expired, used_up, revoked
	Uses  string // "1 of 2", or "3 (no limit)"
	Left  string // "1", or "no limit"
}

type grantsPage struct {
	All  bool
	List []grantView
}

func grantState(g holds.Grant, now time.Time) string {
	switch {
	case !g.Revoked.IsZero():
		return "revoked"
	case g.MaxUses > 0 && g.Uses >= g.MaxUses:
		return "used_up"
	case !now.Before(g.Expires):
		return "expired"
	}
	return "active"
}

func (u *UI) handleGrants(w http.ResponseWriter, r *http.Request, s *session) {
	u.renderGrants(w, r, s, http.StatusOK, "")
}

func (u *UI) renderGrants(w http.ResponseWriter, r *http.Request, s *session, status int, msg string) {
	all := r.URL.Query().Get("status") == "all"
	gs, err := u.opt.Grants.Grants(r.Context(), all, grantsShown)
	if err != nil {
		u.log.Error("review: list grants", "err", err.Error())
		u.fail(w, r, s, http.StatusServiceUnavailable, "Grants cannot be read right now.")
		return
	}
	now := u.opt.Now()
	list := make([]grantView, 0, len(gs))
	for _, g := range gs {
		v := grantView{Grant: g, State: grantState(g, now)}
		if g.MaxUses > 0 {
			v.Uses = fmt.Sprintf("%d of %d", g.Uses, g.MaxUses)
			v.Left = fmt.Sprint(max(g.MaxUses-g.Uses, 0))
		} else {
			v.Uses = fmt.Sprintf("%d (no limit)", g.Uses)
			v.Left = "no limit"
		}
		list = append(list, v)
	}
	p := u.page(s, "Grants", "grants", grantsPage{All: all, List: list})
	p.Message = msg
	u.render(w, status, "grants", p)
}

// handleRevokeGrant revokes one grant (the POST's CSRF token is checked
// by authed) and shows the page again with the outcome.
func (u *UI) handleRevokeGrant(w http.ResponseWriter, r *http.Request, s *session) {
	g, err := u.opt.Grants.RevokeGrant(r.Context(), r.PathValue("id"), s.person)
	switch {
	case errors.Is(err, holds.ErrGrantRevoked):
		u.renderGrants(w, r, s, http.StatusConflict, "That grant was already revoked.")
	case errors.Is(err, holds.ErrGrantNotFound):
		u.renderGrants(w, r, s, http.StatusNotFound, "No grant by that ID.")
	case err != nil:
		u.log.Error("review: revoke grant", "grant", r.PathValue("id"), "err", err.Error())
		u.fail(w, r, s, http.StatusServiceUnavailable, "The grant could not be revoked right now; it still stands.")
	default:
		u.renderGrants(w, r, s, http.StatusOK, "Revoked the grant for "+clip(g.Tool, 128)+": the same call is held for approval again.")
	}
}
