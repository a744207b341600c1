package config

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Audit configures the audit log.
type Audit struct {
	Path string `yaml:"path"`
	// Sync is when records are fsynced: "always" (default: a call's result
	// record is fsynced before its answer is released) or "interval"
	// (records are written before the call proceeds and fsynced by a
	// background loop at most SyncInterval later; a host crash can lose up
	// to SyncInterval of records).
	Sync string `yaml:"sync"`
	// SyncInterval bounds the fsync delay of sync: interval (default 10ms,
	// at most 1s).
	SyncInterval Duration `yaml:"sync_interval"`
	// Checkpoint, when set, has the gateway append a signed statement of
	// the log's head to a second file at an interval (THREATS G9).
	Checkpoint *AuditCheckpoint `yaml:"checkpoint"`
	// RecordInputs has every decision record carry the decision's full
	// input document (arguments included; credentials never: they are
	// attached after the decision), for `sluice policy replay`. Default
	// on; false records none.
	RecordInputs *bool `yaml:"record_inputs"`
	// RecordInputMax caps the recorded input (bytes of JSON; default
	// DefaultRecordInputMax, at most MaxRecordInputMax). A larger input
	// is recorded without its bodies, or not at all, and the record says
	// so (input_truncated, input_size, input_cut).
	RecordInputMax int `yaml:"record_input_max"`
}

// Usage says which tools' calls are counted for input.usage: calls per
// agent, user and session over 1 min / 1 h / 1 day, and the sum of one
// numeric argument. A tool in neither list has no input.usage.
type Usage struct {
	// Tools are the tools (exact names) whose calls are counted.
	Tools []string `yaml:"tools"`
	// Sum maps a tool to the body argument summed ("amount", or a dotted
	// path into the body such as "refund.amount"); the tool is counted
	// too.
	Sum map[string]string `yaml:"sum"`
}

// Counted reports whether tool's calls are counted, and the argument
// summed ("" when none).
func (u Usage) Counted(tool string) (bool, string) {
	if arg, ok := u.Sum[tool]; ok {
		return true, arg
	}
	return slices.Contains(u.Tools, tool), ""
}

// Recording inputs (audit.record_input_max): the default, and the most an
// audit line (256 KiB) leaves room for beside the record's other fields.
const (
	DefaultRecordInputMax = 64 << 10
	MaxRecordInputMax     = 192 << 10
)

// InputsRecorded reports audit.record_inputs (default on).
func (a Audit) InputsRecorded() bool { return a.RecordInputs == nil || *a.RecordInputs }

// AuditCheckpoint configures the signed checkpoints of the audit log's head.
type AuditCheckpoint struct {
	// Path is the file checkpoints are appended to, one JSON line each,
	// fsynced; it belongs on another disk, machine or sink than the log.
	Path string `yaml:"path"`
	// Interval between checkpoints (default 1m, at least 1s).
	Interval Duration `yaml:"interval"`
	// KeyFile holds the Ed25519 signing key (created at first start);
	// default audit-checkpoint.key beside audit.path.
	KeyFile string `yaml:"key_file"`
}

// DefaultCheckpointInterval is audit.checkpoint.interval's default.
const DefaultCheckpointInterval = time.Minute

// Audit sync modes (audit.sync).
const (
	AuditSyncAlways   = "always"
	AuditSyncInterval = "interval"
)

// MaxAuditSyncInterval bounds audit.sync_interval: the records a host crash
// can lose.
const MaxAuditSyncInterval = time.Second

// validateStore checks store: a sqlite: path or a postgres:// URL, never
// echoed (it may hold a password).
func validateStore(store string, bad func(key, format string, args ...any)) {
	switch {
	case strings.HasPrefix(store, "sqlite:"):
		if strings.TrimPrefix(store, "sqlite:") == "" {
			bad("store", "sqlite: needs a path")
		}
	case strings.HasPrefix(store, "postgres://"), strings.HasPrefix(store, "postgresql://"):
		// Checked in full when the store opens (sslmode, pool size,
		// statement_timeout); never echoed here: it may hold a password.
		if _, err := url.Parse(store); err != nil {
			bad("store", "not a postgres:// URL (the value is not shown: it may hold a password)")
		}
	default:
		bad("store", "want sqlite:/path or postgres://…, got %q", RedactURL(store))
	}
}

// validateAudit checks audit.* and usage.*.
func validateAudit(c *Config, bad func(key, format string, args ...any)) {
	if c.Audit.Path == "" {
		bad("audit.path", "must be set: the gateway does not run without an audit log")
	}
	switch c.Audit.Sync {
	case AuditSyncAlways:
	case AuditSyncInterval:
		if iv := c.Audit.SyncInterval.Std(); iv <= 0 || iv > MaxAuditSyncInterval {
			bad("audit.sync_interval", "must be positive and at most %s with audit.sync: interval, got %s", MaxAuditSyncInterval, iv)
		}
	default:
		bad("audit.sync", "want always or interval, got %q", c.Audit.Sync)
	}
	for i, t := range c.Usage.Tools {
		if !strings.Contains(t, ".") || strings.ContainsAny(t, "*?[ ") {
			bad(fmt.Sprintf("usage.tools[%d]", i), "want an exact tool name <connector>.<operation>, got %q", t)
		}
	}
	for t, arg := range c.Usage.Sum {
		if !strings.Contains(t, ".") || strings.ContainsAny(t, "*?[ ") {
			bad("usage.sum."+t, "want an exact tool name <connector>.<operation> as the key")
		}
		if arg == "" || strings.HasPrefix(arg, ".") || strings.HasSuffix(arg, ".") || strings.Contains(arg, "..") {
			bad("usage.sum."+t, "want the body argument to sum (amount, or a dotted path like refund.amount), got %q", arg)
		}
	}
	if m := c.Audit.RecordInputMax; m < 0 || m > MaxRecordInputMax {
		bad("audit.record_input_max", "must be 0 (the default, %d) to %d bytes, got %d", DefaultRecordInputMax, MaxRecordInputMax, m)
	}
	if cp := c.Audit.Checkpoint; cp != nil {
		if cp.Path == "" {
			bad("audit.checkpoint.path", "must be set when audit.checkpoint is")
		} else if cp.Path == c.Audit.Path {
			bad("audit.checkpoint.path", "must not be audit.path: checkpoints belong in a second location")
		}
		if iv := cp.Interval.Std(); iv < time.Second {
			bad("audit.checkpoint.interval", "must be at least 1s, got %s", iv)
		}
	}
}
