// Package audit writes the gateway's tamper-evident audit log: append-only
// JSON lines, each carrying the SHA-256 of the previous line, durable (fsync)
// before Append returns. Concurrent appends share one fsync (group commit),
// and records are written while an fsync runs: the next fsync covers them.
// If a record cannot be made durable, Append fails and the gateway refuses
// the call: audit failure closes.
//
// # Sync modes
//
// SyncAlways (the default) is the above. SyncInterval is the operator's
// choice of throughput over the last moments of the log: Append returns once
// the record is written to the file (a full disk or an unwritable file still
// fails it, so the call is refused before anything is sent), and the writer
// fsyncs at most Options.SyncInterval after the first unsynced write. A
// crash of the host (not of the gateway: the records are in the page cache)
// can lose up to SyncInterval of acknowledged records. A failed background
// fsync puts the log in the failed state: every later Append fails until the
// writer has written the unsynced records again from memory and an fsync of
// them succeeded.
//
// # Format
//
// Each line is the encoding/json output of a Record followed by "\n". Hash is
// the hex SHA-256 of the canonical form of the record: the exact
// encoding/json output of the Record with Hash set to "" (encoding/json sorts
// the Fields map keys and escapes HTML characters; Hash is the last field, so
// the canonical form is the line with its hash value emptied). Prev is the
// previous record's Hash, ZeroHash for the first record, and Seq counts from 1.
// Editing, deleting, inserting or reordering lines breaks the chain, which
// Verify reports with the line number. The chain is unkeyed: it proves the
// log is internally consistent, and an anchor of a recent hash kept elsewhere
// proves nobody rewrote it whole or cut its end: see Head, CheckHead and
// Checkpoint (head.go, checkpoint.go).
//
// # Caller contract
//
// Record.Fields must never contain secrets (credential values, Vault tokens,
// upstream bodies that may echo them): the log is read by people and exported
// to other systems. Put names, lease IDs and HMACs in it, never values.
//
// # Failures
//
// A write or fsync failure fails every Append of that batch and leaves the
// log in a failed state (see Err); the next Append truncates the file back to
// the end of the last durable record, so a partial line never breaks the
// chain, and retries. One exception: when a failed fsync (SyncAlways) covered
// a record AppendWritten had already answered as written, nothing is taken
// back (that caller went on): the records since the last good fsync are
// written again from memory and fsynced before anything else is appended,
// as in SyncInterval mode, and the records of the Appends that failed stay
// in the chain. The gateway answers 503 audit_unavailable meanwhile and
// resumes when the disk is writable again (THREATS G5).
//
// If the log file is deleted under the running gateway (its link count drops
// to zero), the Appends of the batch that notices fail: the records since the
// last export are gone and someone must look. The next Append re-creates the
// file (O_EXCL, 0600) and starts it with an "audit_log_recreated" record whose
// Seq and Prev continue the old chain; verify such a file with VerifyFrom. If
// the file was renamed (rotated) instead, nothing was lost and the new file is
// created the same way without failing any Append. If another file has been
// put at the path, Appends fail until it is moved away: the log never appends
// to a file it did not create.
package audit

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"
)

// ZeroHash is the Prev of the first record of a log.
const ZeroHash = "0000000000000000000000000000000000000000000000000000000000000000"

// MaxRecord bounds one line of the log, newline included.
const MaxRecord = 256 << 10

// Event of the record that starts a re-created log file.
const EventRecreated = "audit_log_recreated"

// SyncMode says when records are fsynced; see Options.
type SyncMode int

// Sync modes.
const (
	SyncAlways   SyncMode = iota // Append returns after the fsync covering its record
	SyncInterval                 // Append returns once written; fsync at most SyncInterval later
)

// maxKeptBatch bounds the batch buffer the writer keeps for the next batch.
const maxKeptBatch = 256 << 10

// maxUnsynced bounds the bytes kept in memory for a SyncInterval log between
// fsyncs; a batch that would exceed it is fsynced at once.
const maxUnsynced = 8 << 20

// Options configure a Log. The zero value is SyncAlways.
type Options struct {
	Sync SyncMode
	// SyncInterval is the longest a written record waits for its fsync in
	// SyncInterval mode; it must be positive there.
	SyncInterval time.Duration
	// Replica, when set, is written into every record (Record.Replica):
	// replicas sharing one store each write their own file, and a reader
	// of several files sees which replica wrote a record.
	Replica string
}

// Errors returned (wrapped) by Append.
var (
	ErrClosed   = errors.New("audit: log closed")
	ErrUnlinked = errors.New("audit: log file was deleted")
	ErrReplaced = errors.New("audit: log path now holds a file the log did not create")
	ErrModified = errors.New("audit: log file modified by another writer")
)

// Record is one audit entry. The writer fills Seq, Time, Prev and Hash.
type Record struct {
	Seq       uint64    `json:"seq"`
	Time      time.Time `json:"time"`
	Prev      string    `json:"prev"` // hex sha256 of the previous line; 64 zeros for the first
	RequestID string    `json:"request_id"`
	Event     string    `json:"event"` // "decision", "secret_reflected", ...
	// Replica is the id of the gateway replica that wrote the record
	// (Options.Replica); omitted when none is set, so logs written before
	// it existed verify unchanged.
	Replica string         `json:"replica,omitempty"`
	Fields  map[string]any `json:"fields,omitempty"`
	Hash    string         `json:"hash"` // hex sha256 of this record with Hash empty

	// Sorted is Fields as key/value pairs in increasing key order, no key
	// twice: a caller that writes the same shape of record for every
	// request hands it over without building a map. The line is the one
	// Fields would give; pairs out of order are put into Fields first.
	Sorted []Field `json:"-"`
}

// Field is one key and value of a record's fields.
type Field struct {
	Key   string
	Value any
}

// Log is an open audit log. Safe for concurrent use.
type Log struct {
	path     string
	now      func() time.Time
	wrap     func(*os.File) file
	interval time.Duration // > 0: SyncInterval mode
	replica  string        // Options.Replica

	mu      sync.Mutex
	pending []*request
	closed  bool
	failure error // last write failure; nil when healthy

	wake chan struct{} // cap 1: pending is non-empty
	stop chan struct{}
	done chan struct{}

	// smu is held across an fsync of SyncAlways records (syncWaiting),
	// without wmu: records are written while the previous ones are
	// fsynced. Taken before wmu, never while holding it.
	smu sync.Mutex

	// wmu is the writer's lock: whoever holds it (a caller of Append, or
	// the writer goroutine) owns the fields below.
	wmu        sync.Mutex
	f          file // nil after the file vanished, until re-created
	off        int64
	seq        uint64
	prev       string
	broken     bool   // the last write failed: the file may hold a partial line past off
	wbuf       []byte // the last batch's lines: their memory is the next batch's
	watch      *pathWatch
	pathKnown  bool // l.path was seen to name f, and watch has seen no change since
	needMarker bool // the file was re-created: start it with EventRecreated

	// Owned by the writer: the bytes written to f since its last
	// successful fsync (from syncedOff to off), kept to write them again
	// after a failed fsync, and the chain's end at syncedOff.
	unsynced   []byte
	syncedOff  int64
	syncedSeq  uint64
	syncedPrev string
	syncFailed bool        // the last fsync failed: unsynced must be rewritten and fsynced
	syncDue    *time.Timer // made stopped at Open; run waits on it
	syncArmed  bool

	// SyncAlways mode, owned by the writer: the records written and
	// waiting for the fsync that makes them durable (syncWaiting answers
	// them); the end of the last record answered before its fsync
	// (AppendWritten); whether the EventRecreated marker is not fsynced
	// yet; and the file's generation, counted up when the file is let go.
	waiting        []*request
	ackedOff       int64
	markerUnsynced bool
	fileGen        uint64
	lostGen        uint64        // counted up by syncLost: an fsync running meanwhile proves nothing
	syncing        bool          // a syncWaiting is between taking its batch and answering it
	syncKick       chan struct{} // cap 1: waiting is non-empty and its writer does not fsync it
	syncedHook     func()        // tests: runs in syncWaiting after an fsync, with wmu held

	records, syncs, batches, failures atomic.Uint64
	truncatedTail                     int64
}

type request struct {
	rec    Record
	body   []byte      // rec's request_id, event and fields, encoded by Append; nil: encode rec whole
	nosync bool        // answer once written to the file, before the fsync
	queued bool        // written, in l.waiting: answered by syncWaiting, not by commit
	res    result      // set by write, sent by commit
	done   chan result // cap 1
}

type result struct {
	rec Record
	err error
}

// Stats counts what the log did since Open.
type Stats struct {
	Records       uint64 // records made durable (SyncInterval: written)
	Syncs         uint64 // successful fsyncs: Records/Syncs is the group-commit factor
	Batches       uint64 // write attempts
	Failures      uint64 // batches that failed, and failed background fsyncs (SyncInterval)
	TruncatedTail int64  // bytes of a partial last line removed at Open
}

// Stats returns the counters.
func (l *Log) Stats() Stats {
	return Stats{
		Records: l.records.Load(), Syncs: l.syncs.Load(),
		Batches: l.batches.Load(), Failures: l.failures.Load(),
		TruncatedTail: l.truncatedTail,
	}
}

// Err returns the error of the last batch if it failed, nil if it succeeded
// (for a readiness check: the next Append retries either way).
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.failure
}

// Open opens (creating 0600 if absent) the log at path, reading its tail to
// continue the chain. A log whose tail is broken refuses to open.
//
// A last line without its newline is the remnant of a write that crashed
// before its fsync completed, so it was never acknowledged to any caller;
// Open truncates it away (Stats().TruncatedTail says how much). A complete
// last line that is not a self-consistent record is corruption: Open fails.
// The file is flock'ed so that a second gateway cannot write the same log.
func Open(path string) (*Log, error) {
	return OpenWith(path, Options{})
}

// OpenWith is Open with options.
func OpenWith(path string, o Options) (*Log, error) {
	return open(path, o, func(f *os.File) file { return f })
}

func open(path string, o Options, wrap func(*os.File) file) (*Log, error) {
	var interval time.Duration
	switch o.Sync {
	case SyncAlways:
	case SyncInterval:
		if o.SyncInterval <= 0 {
			return nil, fmt.Errorf("audit: open: sync interval must be positive, got %s", o.SyncInterval)
		}
		interval = o.SyncInterval
	default:
		return nil, fmt.Errorf("audit: open: unknown sync mode %d", o.Sync)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	osf, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	l := &Log{
		path: path, now: time.Now, wrap: wrap, interval: interval, replica: o.Replica,
		wake: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{}),
		syncKick: make(chan struct{}, 1),
		prev:     ZeroHash,
	}
	if err := l.adopt(osf); err != nil {
		osf.Close()
		return nil, err
	}
	l.watch = watchPath(path) // watch_linux.go
	if interval > 0 {
		l.syncDue = time.NewTimer(interval)
		l.syncDue.Stop()
	}
	go l.run()
	return l, nil
}

// Append makes rec durable and returns it as written (with Seq and Hash).
//
// It returns only after the fsync covering rec succeeded, or with an error.
// In SyncInterval mode it returns once rec is written (see Sync modes).
// If ctx ends first, Append returns ctx's error, but the record is already
// queued and may still be written: treat that as "unknown", not "not logged".
func (l *Log) Append(ctx context.Context, rec Record) (Record, error) {
	return l.append(ctx, rec, false)
}

// AppendWritten is Append that returns once rec is written to the log file
// (in the kernel's page cache: it survives the gateway's crash, not the
// host's) without waiting for the fsync. The next Append's fsync makes it
// durable with that record. The gateway uses it for the decision record it
// writes before dialling upstream, and Append for the result it writes
// before answering, so one fsync per call covers both.
func (l *Log) AppendWritten(ctx context.Context, rec Record) (Record, error) {
	return l.append(ctx, rec, true)
}

// AppendFor is Append (written: AppendWritten) bounded by timeout rather
// than by a context: the caller's cancellation never stops a record (the
// gateway writes every record of a call that happened, whatever its
// caller does). A record that is answered by the time its caller would
// start to wait, as every record of a caller that wrote its own batch is,
// arms no timer; one that waits for another writer or an fsync waits at
// most timeout, then fails with context.DeadlineExceeded (the record may
// still be written).
func (l *Log) AppendFor(rec Record, written bool, timeout time.Duration) (Record, error) {
	r, err := l.enqueue(rec, written)
	if err != nil {
		return Record{}, err
	}
	select {
	case res := <-r.done:
		return res.rec, res.err
	default:
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case res := <-r.done:
		return res.rec, res.err
	case <-t.C:
		return Record{}, fmt.Errorf("audit: append (record may still be written): %w after %s", context.DeadlineExceeded, timeout)
	}
}

func (l *Log) append(ctx context.Context, rec Record, nosync bool) (Record, error) {
	if err := ctx.Err(); err != nil {
		return Record{}, fmt.Errorf("audit: append: %w", err)
	}
	r, err := l.enqueue(rec, nosync)
	if err != nil {
		return Record{}, err
	}
	select {
	case res := <-r.done:
		return res.rec, res.err
	case <-ctx.Done():
		return Record{}, fmt.Errorf("audit: append (record may still be written): %w", ctx.Err())
	}
}

// enqueue encodes rec, queues it and, when no one else is writing, writes
// the batch on the caller's goroutine. The request's done channel carries
// the result.
func (l *Log) enqueue(rec Record, nosync bool) (*request, error) {
	// Encode the caller's part of the line here, in parallel with other
	// callers, so that the writer, which every record passes through in
	// turn, only adds seq, time, prev and the hash.
	rec.Replica = l.replica
	if rec.Sorted != nil && (len(rec.Fields) > 0 || !sortedFields(rec.Sorted)) {
		foldSorted(&rec)
	}
	body, ok := appendRecordBody(make([]byte, 0, 640), &rec)
	if !ok && rec.Sorted != nil {
		// A value the fast encoder declines: the writer encodes the
		// record whole, with encoding/json, which needs the map.
		foldSorted(&rec)
		body, ok = appendRecordBody(body[:0], &rec)
	}
	if !ok {
		body = nil
	}
	r := &request{rec: rec, body: body, nosync: nosync, done: make(chan result, 1)}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil, ErrClosed
	}
	l.pending = append(l.pending, r)
	l.mu.Unlock()
	// Write the batch here when no one else is writing: the caller's own
	// goroutine is already running, and a handoff to the writer goroutine
	// and back cost more than the write. Whoever holds the writer's lock
	// looks at pending again when it lets go (release), so a record left
	// behind here is written by the writer goroutine.
	if l.wmu.TryLock() {
		l.commitPending()
		more := l.interval == 0 && len(l.waiting) > 0
		l.release()
		switch {
		case !more:
		case !nosync:
			// This caller waits for an fsync anyway: it runs it, for
			// every record written so far (a concurrent one first).
			l.syncWaiting()
		default:
			// Answered once written; the fsync of the others' records
			// it wrote is the writer goroutine's.
			select {
			case l.syncKick <- struct{}{}:
			default:
			}
		}
	}
	return r, nil
}

// commitPending writes every pending record in one batch, with one write
// and one fsync, and answers their callers. The caller holds wmu.
func (l *Log) commitPending() {
	l.mu.Lock()
	batch := l.pending
	l.pending = nil
	l.mu.Unlock()
	if len(batch) > 0 {
		l.commit(batch)
	}
	l.armSync()
}

// release lets go of wmu and, if records arrived meanwhile, wakes the
// writer goroutine for them: their callers found wmu held and left their
// records to whoever held it.
func (l *Log) release() {
	l.wmu.Unlock()
	l.mu.Lock()
	more := len(l.pending) > 0
	l.mu.Unlock()
	if more {
		select {
		case l.wake <- struct{}{}:
		default: // the writer is already due to look
		}
	}
}

// run is the writer goroutine. It writes the records that arrive while
// another caller writes (see append), runs the SyncInterval fsyncs when
// their timer fires, and at Close writes what is left and makes it durable.
func (l *Log) run() {
	defer close(l.done)
	var due <-chan time.Time
	if l.syncDue != nil {
		due = l.syncDue.C
	}
	for {
		select {
		case <-l.wake:
			l.wmu.Lock()
			l.commitPending()
			l.release()
			l.syncWaiting()
		case <-l.syncKick:
			l.syncWaiting()
		case <-due:
			l.wmu.Lock()
			l.syncArmed = false
			l.syncWritten()
			l.armSync()
			l.release()
		case <-l.stop:
			// Append refuses new records once closed is set, before stop.
			l.wmu.Lock()
			l.commitPending()
			l.syncLocked()
			if l.interval > 0 && l.f != nil {
				// Close makes everything written durable.
				if l.syncFailed {
					_ = l.resync()
				} else {
					l.syncWritten()
				}
			}
			l.wmu.Unlock()
			return
		}
	}
}

func (l *Log) commit(batch []*request) {
	l.batches.Add(1)
	err := l.write(batch)
	if err != nil {
		l.failures.Add(1)
	}
	// Publish the state before answering, so a caller that saw its Append
	// succeed or fail sees the same in Err.
	l.mu.Lock()
	l.failure = err
	l.mu.Unlock()
	for _, r := range batch {
		if !r.queued {
			r.done <- r.res
		}
	}
}

// write sets the result of every request of batch.
func (l *Log) write(batch []*request) error {
	if err := l.ready(); err != nil {
		answerAll(batch, err)
		return err
	}
	seq, prev := l.seq, l.prev
	buf := l.wbuf[:0]
	written := make([]*request, 0, len(batch))
	outs := make([]Record, 0, len(batch))
	if l.needMarker {
		rec := Record{Event: EventRecreated, Replica: l.replica, Fields: map[string]any{
			"reason":       "log file was deleted or rotated; this file continues the chain",
			"previous_seq": seq,
		}}
		var err error
		l.markerUnsynced = l.interval == 0
		if buf, rec, err = l.appendLine(buf, rec, nil, seq+1, prev); err != nil {
			err = fmt.Errorf("bug(): audit: encode marker: %w", err)
			answerAll(batch, err)
			return err
		}
		seq, prev = rec.Seq, rec.Hash
	}
	for _, r := range batch {
		var (
			rec Record
			err error
		)
		if buf, rec, err = l.appendLine(buf, r.rec, r.body, seq+1, prev); err != nil {
			r.res = result{err: err} // this record only: it never gets a Seq
			continue
		}
		seq, prev = rec.Seq, rec.Hash
		written = append(written, r)
		outs = append(outs, rec)
	}
	if len(written) == 0 && !l.needMarker {
		return nil
	}
	if cap(buf) <= maxKeptBatch {
		l.wbuf = buf // the next batch encodes into the same memory
	}
	_, err := l.f.WriteAt(buf, l.off)
	// SyncAlways: fsynced by syncWaiting, once the writer's lock is let go,
	// so that the next records are written meanwhile. SyncInterval: by the
	// timer, unless the memory kept for a rewrite would grow past its
	// bound.
	sync := l.interval > 0 && len(l.unsynced)+len(buf) > maxUnsynced
	if err == nil && sync {
		err = l.f.Sync()
		if err == nil {
			l.syncs.Add(1)
		} else if l.interval > 0 {
			l.syncFailed = true // the earlier unsynced records too
		}
	}
	if err != nil {
		// The file may hold part of buf (or, after a failed fsync, pages
		// of unknown state): the next batch truncates back to l.off.
		l.broken = true
		err = fmt.Errorf("audit: write log: %w", err)
		answerAll(written, err)
		return err
	}
	l.off += int64(len(buf))
	l.seq, l.prev = seq, prev
	l.broken, l.needMarker = false, false
	if sync {
		l.markSynced()
	} else {
		l.unsynced = append(l.unsynced, buf...)
	}
	acked := 0
	for i, r := range written {
		r.res = result{rec: outs[i]}
		if l.interval == 0 && !r.nosync {
			r.queued = true
			l.waiting = append(l.waiting, r)
			continue
		}
		acked++
		if r.nosync {
			l.ackedOff = l.off
		}
	}
	l.records.Add(uint64(acked))
	if l.interval == 0 && len(l.unsynced) > maxUnsynced {
		// Records answered when written and none waiting for an fsync:
		// the memory kept for a rewrite is bounded here.
		_ = l.syncLocked()
	}
	return nil
}

func answerAll(batch []*request, err error) {
	for _, r := range batch {
		r.res = result{err: err}
	}
}

// encode fills the writer's fields of rec and returns its line. body, when
// not nil, is appendRecordBody's encoding of rec.
func (l *Log) encode(rec Record, body []byte, seq uint64, prev string) ([]byte, Record, error) {
	return l.appendLine(nil, rec, body, seq, prev)
}

// appendLine is encode appending the line to dst. On an error dst is
// returned as it was.
func (l *Log) appendLine(dst []byte, rec Record, body []byte, seq uint64, prev string) ([]byte, Record, error) {
	rec.Seq, rec.Time, rec.Prev, rec.Hash = seq, l.now().UTC(), prev, ""
	start := len(dst)
	var ok bool
	b := dst
	if body != nil {
		// encoding/json's bytes, faster (encode.go)
		if b, ok = appendRecordHead(b, &rec); ok {
			b = appendRecordHash(append(b, body...), "")
		}
	} else {
		b, ok = appendRecord(b, &rec)
	}
	if !ok {
		j, err := json.Marshal(rec)
		if err != nil {
			return dst[:start], Record{}, fmt.Errorf("audit: encode record: %w", err)
		}
		b = append(b[:start], j...)
	}
	if n := len(b) - start + 64 + 1; n > MaxRecord {
		return dst[:start], Record{}, fmt.Errorf("audit: encode record: %d bytes, limit %d", n, MaxRecord)
	}
	sum := sha256.Sum256(b[start:])
	var hx [2 * sha256.Size]byte
	hex.Encode(hx[:], sum[:])
	rec.Hash = string(hx[:])
	b = b[:len(b)-len(`"}`)] // ends with the hash's opening quote
	b = append(b, hx[:]...)
	b = append(b, "\"}\n"...)
	return b, rec, nil
}

// Close waits for queued records to be written, then closes the file.
// Appends after Close return ErrClosed.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.closed = true
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	// A caller of Append that took the writer's lock after the writer
	// goroutine's last batch finds nothing pending; it is let go first,
	// and what it wrote for others is fsynced here.
	l.smu.Lock()
	defer l.smu.Unlock()
	l.wmu.Lock()
	defer l.wmu.Unlock()
	_ = l.syncLocked()
	l.watch.close()
	if l.syncDue != nil {
		l.syncDue.Stop()
	}
	if l.f == nil {
		return nil
	}
	var serr error
	if l.syncFailed {
		serr = fmt.Errorf("audit: close: %d bytes of records were never fsynced", len(l.unsynced))
	}
	err := l.f.Close()
	l.f = nil
	if err != nil {
		return errors.Join(serr, fmt.Errorf("audit: close: %w", err))
	}
	return serr
}
