package gateway

import (
	"context"
	"time"

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

// auditTimeout bounds one audit write, now that no write waits on its
// caller's context: an audit log that takes longer is unavailable.
const auditTimeout = 30 * time.Second

// auditLog is the gateway's audit log: the hash-chained file, and the one
// way records are written to it (append).
type auditLog struct {
	*audit.Log
	// export feeds the decision-log export from each record written
	// (policylife.Life.DecisionExport); nil: none.
	export func(rec audit.Record, at time.Time)
}

// record appends rec synced (append): the hook the packages that write
// records of their own (admin, grants) are handed.
func (l auditLog) record(ctx context.Context, rec audit.Record) error {
	_, err := l.append(ctx, rec, false)
	return err
}

// append is the one way the gateway writes an audit record. The write is detached from ctx's
// cancellation and has its own deadline (THREATS G10): a caller that hangs
// up while its call is at the upstream cancels its request's context,
// and a record written with that context was lost (`audit_unavailable:
// context canceled`) although the call was sent. Every record of a call
// that happened is written, whatever the caller does. written is
// AppendWritten: the record need only reach the file, a later one's fsync
// makes it durable.
//
// No context or timer is made per record (audit.Log.AppendFor): a record
// its caller wrote itself, as every record of a call made alone is, is
// answered before the caller would wait, and only a wait arms the timer.
func (l auditLog) append(_ context.Context, rec audit.Record, written bool) (audit.Record, error) {
	out, err := l.AppendFor(rec, written, auditTimeout)
	if err == nil && l.export != nil {
		l.export(rec, out.Time) // the decision log is fed from the record
	}
	return out, err
}
