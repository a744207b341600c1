package gateway

import (
	"context"
	"fmt"
)

// replicaLost is told when this replica's id was taken by another
// gateway while its lock connection to the store was down (THREATS G21):
// two processes then write one audit head and one set of hold leases.
// The store keeps trying to take the id back; this says so loudly, each
// time, for an operator to stop the one started by mistake.
func (s *Server) replicaLost(err error) {
	s.log.Error("gateway: another gateway runs under this gateway.replica_id; stop one of them", "err", err)
}

// rekeyLegacyHead moves the audit head this gateway recorded before
// replica ids (keyed by its host name and audit path) to its replica id,
// before the start's check against it (THREATS G22): the file is then
// checked against the head its previous version left, not against none,
// and `sluice audit verify --heads` finds its file.
func (s *Server) rekeyLegacyHead(ctx context.Context) error {
	from, err := s.store.RekeyLegacyAuditHead(ctx)
	if err != nil {
		return fmt.Errorf("audit.path: %w", err)
	}
	if from != "" {
		s.log.Info("audit: the head recorded before replica ids is now this replica's", "from", from, "replica", s.cfg.Gateway.ReplicaID)
	}
	return nil
}
