package gateway

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/sluice-gw/sluice/gateway/audit"
)

// headRecordInterval is how often the gateway records the audit log's
// durable head in its store (when it changed). A rewrite of the log offline
// is caught at the next start against this head; records written after the
// last one recorded (at most this long before a crash; none after a clean
// stop, which records the final head) are not covered.
const headRecordInterval = time.Second

// auditHeads records the audit log's head in the store and in signed
// checkpoints (THREATS G9).
type auditHeads struct {
	key      ed25519.PrivateKey // nil: no checkpoints
	path     string
	interval time.Duration
	last     audit.Head // last head recorded in the store
}

// checkAuditHead compares the audit log with the head the store recorded
// last, and with the newest checkpoint when checkpoints are on, before
// anything is served: a file that ends before that head, or holds another
// record at its seq, was truncated or rewritten, and the gateway refuses to
// continue it (fail closed) until an operator accepts the file's head with
// `sluice audit accept-head`.
func (s *Server) checkAuditHead(ctx context.Context) error {
	path := s.cfg.Audit.Path
	if err := s.rekeyLegacyHead(ctx); err != nil { // replica.go (THREATS G22)
		return err
	}
	seq, hash, updated, ok, err := s.store.AuditHead(ctx)
	if err != nil {
		return fmt.Errorf("audit.path: check against the head recorded in the store: %w", err)
	}
	if ok {
		if err := s.checkHead(path, audit.Head{Seq: seq, Hash: hash}, "the head the store recorded at "+updated.Format(time.RFC3339)); err != nil {
			return err
		}
	}
	if cp := s.cfg.Audit.Checkpoint; cp != nil {
		key, err := audit.LoadCheckpointKey(cp.KeyFile, true)
		if err != nil {
			return fmt.Errorf("audit.checkpoint.key_file: %w", err)
		}
		s.heads.key, s.heads.path, s.heads.interval = key, cp.Path, cp.Interval.Std()
		newest, _, err := audit.ReadCheckpoints(cp.Path, key.Public().(ed25519.PublicKey))
		switch {
		case errors.Is(err, fs.ErrNotExist):
		case err != nil:
			return fmt.Errorf("audit.checkpoint.path: %w", err)
		default:
			if err := s.checkHead(path, newest.Head(), "the newest checkpoint in "+cp.Path); err != nil {
				return err
			}
		}
	}
	h := s.audit.Head()
	if err := s.store.SetAuditHead(ctx, h.Seq, h.Hash); err != nil {
		return fmt.Errorf("audit.path: record head in the store: %w", err)
	}
	s.heads.last = h
	return nil
}

func (s *Server) checkHead(path string, want audit.Head, where string) error {
	got, ok, err := audit.CheckHead(path, want)
	var he *audit.HeadError
	switch {
	case errors.As(err, &he):
		return fmt.Errorf("audit.path: %s does not match %s: it %s: recorded head %s, file's head %s; if the file was replaced on purpose, run `sluice audit accept-head` with the gateway stopped",
			path, where, he.Reason, he.Want, he.Got)
	case err != nil:
		return fmt.Errorf("audit.path: check against %s: %w", where, err)
	case !ok:
		s.log.Warn("audit: the log starts after the recorded head (it was re-created); the recorded record is in an earlier file",
			"recorded_head", want.String(), "file_head", got.String())
	}
	return nil
}

// headLoop records the log's durable head in the store when it changed and
// appends a signed checkpoint at the configured interval, until ctx ends.
func (s *Server) headLoop(ctx context.Context) {
	t := time.NewTicker(headRecordInterval)
	defer t.Stop()
	var cp <-chan time.Time
	if s.heads.key != nil {
		ct := time.NewTicker(s.heads.interval)
		defer ct.Stop()
		cp = ct.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.recordHead(ctx)
		case <-cp:
			s.writeCheckpoint()
		}
	}
}

// recordHead records the durable head in the store if it moved.
func (s *Server) recordHead(ctx context.Context) {
	if s.audit.Head() == s.heads.last {
		return
	}
	h, err := s.audit.DurableHead()
	if err != nil {
		return // the log's own failure refuses calls and is logged there
	}
	if err := s.store.SetAuditHead(ctx, h.Seq, h.Hash); err != nil {
		s.log.Error("audit: record head in the store", "err", err)
		return
	}
	s.heads.last = h
}

// writeCheckpoint appends a signed checkpoint of the durable head.
func (s *Server) writeCheckpoint() {
	h, err := s.audit.DurableHead()
	if err != nil {
		return
	}
	if err := audit.AppendCheckpoint(s.heads.path, audit.NewCheckpoint(s.heads.key, h, time.Now())); err != nil {
		s.log.Error("audit: write checkpoint", "path", s.heads.path, "err", err)
	}
}

// closeHeads records the final head and checkpoint at a clean stop, so a
// log truncated while the gateway is stopped is caught at the next start.
// Serve's loop has ended: nothing else writes s.heads.
func (s *Server) closeHeads() {
	if _, err := os.Stat(s.cfg.Audit.Path); err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s.recordHead(ctx)
	if s.heads.key != nil {
		s.writeCheckpoint()
	}
}
