// Package heads keeps the audit log's head where a rewrite of the log is
// caught (THREATS G9): in the gateway's store, recorded once a second when
// it moved and at a clean stop, and in signed checkpoints when
// audit.checkpoint is set. Check compares the log with both before
// anything is served; a log that ends before the recorded head, or holds
// another record at its seq, is refused until an operator accepts it.
package heads

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/store"
)

// headRecordInterval is how often the gateway records the audit log's
// durable head in its store (when it changed). A rewrite of the log offline
// is caught at the next start against this head; records written after the
// last one recorded (at most this long before a crash; none after a clean
// stop, which records the final head) are not covered.
const headRecordInterval = time.Second

// Recorder records the audit log's head in the store and in signed
// checkpoints (THREATS G9). Its zero value is not usable: make it with New.
type Recorder struct {
	cfg   config.Audit
	log   *audit.Log
	store *store.Store
	warn  *slog.Logger

	key      ed25519.PrivateKey // nil: no checkpoints
	path     string
	interval time.Duration
	last     audit.Head // last head recorded in the store
}

// New returns the recorder of log's head (audit's config) in st; warn is
// where it logs what it could not record.
func New(cfg config.Audit, log *audit.Log, st *store.Store, warn *slog.Logger) *Recorder {
	return &Recorder{cfg: cfg, log: log, store: st, warn: warn}
}

// Check compares the audit log with the head the store recorded
// last, and with the newest checkpoint when checkpoints are on, before
// anything is served: a file that ends before that head, or holds another
// record at its seq, was truncated or rewritten, and the gateway refuses to
// continue it (fail closed) until an operator accepts the file's head with
// `sluice audit accept-head`.
func (hs *Recorder) Check(ctx context.Context) error {
	path := hs.cfg.Path
	if err := hs.rekeyLegacy(ctx); err != nil { // THREATS G22
		return err
	}
	seq, hash, updated, ok, err := hs.store.AuditHead(ctx)
	if err != nil {
		return fmt.Errorf("audit.path: check against the head recorded in the store: %w", err)
	}
	if ok {
		if err := hs.checkHead(path, audit.Head{Seq: seq, Hash: hash}, "the head the store recorded at "+updated.Format(time.RFC3339)); err != nil {
			return err
		}
	}
	if cp := hs.cfg.Checkpoint; cp != nil {
		key, err := audit.LoadCheckpointKey(cp.KeyFile, true)
		if err != nil {
			return fmt.Errorf("audit.checkpoint.key_file: %w", err)
		}
		hs.key, hs.path, hs.interval = key, cp.Path, cp.Interval.Std()
		newest, _, err := audit.ReadCheckpoints(cp.Path, key.Public().(ed25519.PublicKey))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Errorf("audit.checkpoint.path: %w", err)
		default:
			if err := hs.checkHead(path, newest.Head(), "the newest checkpoint in "+cp.Path); err != nil {
				return err
			}
		}
	}
	h := hs.log.Head()
	if err := hs.store.SetAuditHead(ctx, h.Seq, h.Hash); err != nil {
		return fmt.Errorf("audit.path: record head in the store: %w", err)
	}
	hs.last = h
	return nil
}

// rekeyLegacy moves the audit head this gateway recorded before replica
// ids (keyed by its host name and audit path) to its replica id, before
// the start's check against it (THREATS G22): the file is then checked
// against the head its previous version left, not against none, and
// `sluice audit verify --heads` finds its file.
func (hs *Recorder) rekeyLegacy(ctx context.Context) error {
	from, err := hs.store.RekeyLegacyAuditHead(ctx)
	if err != nil {
		return fmt.Errorf("audit.path: %w", err)
	}
	if from != "" {
		hs.warn.Info("audit: the head recorded before replica ids is now this replica's", "from", from)
	}
	return nil
}

func (hs *Recorder) checkHead(path string, want audit.Head, where string) error {
	got, ok, err := audit.CheckHead(path, want)
	var he *audit.HeadError
	switch {
	case errors.As(err, &he):
		return fmt.Errorf("audit.path: %s does not match %s: it %s: recorded head %s, file's head %s; if the file was replaced on purpose, run `sluice audit accept-head` with the gateway stopped",
			path, where, he.Reason, he.Want, he.Got)
	case err != nil:
		return fmt.Errorf("audit.path: check against %s: %w", where, err)
	case !ok:
		hs.warn.Warn("audit: the log starts after the recorded head (it was re-created); the recorded record is in an earlier file",
			"recorded_head", want.String(), "file_head", got.String())
	}
	return nil
}

// Run records the log's durable head in the store when it changed and
// appends a signed checkpoint at the configured interval, until ctx ends.
func (hs *Recorder) Run(ctx context.Context) {
	t := time.NewTicker(headRecordInterval)
	defer t.Stop()
	var cp <-chan time.Time
	if hs.key != nil {
		ct := time.NewTicker(hs.interval)
		defer ct.Stop()
		cp = ct.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			hs.record(ctx)
		case <-cp:
			hs.writeCheckpoint()
		}
	}
}

// record records the durable head in the store if it moved.
func (hs *Recorder) record(ctx context.Context) {
	if hs.log.Head() == hs.last {
		return
	}
	h, err := hs.log.DurableHead()
	if err != nil {
		return // the log's own failure refuses calls and is logged there
	}
	if err := hs.store.SetAuditHead(ctx, h.Seq, h.Hash); err != nil {
		hs.warn.Error("audit: record head in the store", "err", err)
		return
	}
	hs.last = h
}

// writeCheckpoint appends a signed checkpoint of the durable head.
func (hs *Recorder) writeCheckpoint() {
	h, err := hs.log.DurableHead()
	if err != nil {
		return
	}
	if err := audit.AppendCheckpoint(hs.path, audit.NewCheckpoint(hs.key, h, time.Now())); err != nil {
		hs.warn.Error("audit: write checkpoint", "path", hs.path, "err", err)
	}
}

// Close records the final head and checkpoint at a clean stop, so a
// log truncated while the gateway is stopped is caught at the next start.
// Serve's loop has ended: nothing else writes hs.
func (hs *Recorder) Close() {
	if _, err := os.Stat(hs.cfg.Path); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	hs.record(ctx)
	if hs.key != nil {
		hs.writeCheckpoint()
	}
}
