package gateway

import (
	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
)

// auditOptions maps audit.sync and audit.sync_interval to the log's
// options. Validate has checked both.
func auditOptions(a config.Audit) audit.Options {
	if a.Sync == config.AuditSyncInterval {
		return audit.Options{Sync: audit.SyncInterval, SyncInterval: a.SyncInterval.Std()}
	}
	return audit.Options{Sync: audit.SyncAlways}
}
