package egress

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// A sandbox's narrowing is checked against its agent's allowlist here, when
// sandboxd asks for the tools at create (and a hosted run's token is
// minted); at run time NarrowedOut holds each raw-egress request to it
// (narrow.go).

// CheckNarrowing refuses (and audits through appendRec, the root's one
// audit write) an identity whose narrowing names a host the agent's
// allowlist does not cover: a narrowing never widens.
func CheckNarrowing(ctx context.Context, appendRec func(context.Context, audit.Record, bool) (audit.Record, error), rid string, id wire.Identity, allow []string) *refusal.Error {
	hosts, err := wire.ParseEgress(id.Egress)
	if err != nil {
		return refusal.New(http.StatusForbidden, refusal.EgressNotGranted, err.Error())
	}
	var wider []string
	for _, h := range hosts {
		if !wire.EgressCovers(allow, h) {
			wider = append(wider, h)
		}
	}
	if len(wider) == 0 {
		return nil
	}
	f := map[string]any{"sandbox": id.Sandbox, "agent": id.Agent, "session": id.Session, "user": id.User,
		"egress": id.Egress, "not_granted": wider, "code": string(refusal.EgressNotGranted)}
	if _, err := appendRec(ctx, audit.Record{RequestID: rid, Event: "egress_not_granted", Fields: f}, false); err != nil {
		e := refusal.New(http.StatusServiceUnavailable, refusal.AuditUnavailable, "the audit log cannot be written; nothing is served until it can").Wrap(err)
		return e
	}
	return refusal.New(http.StatusForbidden, refusal.EgressNotGranted,
		fmt.Sprintf("egress %s is not on agent %q's egress allowlist (agents[].egress): a sandbox's --egress may only narrow it", strings.Join(wider, ", "), id.Agent))
}
