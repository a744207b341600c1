package gateway

import "log/slog"

// replicaLost is told when this replica's id was taken by another
// gateway while its lock connection to the store was down (THREATS G21):
// two processes then write one audit head and one set of hold leases.
// The store keeps trying to take the id back; this says so loudly, each
// time, for an operator to stop the one started by mistake.
func replicaLost(log *slog.Logger) func(error) {
	return func(err error) {
		log.Error("gateway: another gateway runs under this gateway.replica_id; stop one of them", "err", err)
	}
}
