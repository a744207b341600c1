package audit

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
)

// The file under the log: adopting an existing one at open, checking
// before each write that it is still the file at the path (rotated,
// unlinked, recreated), and making what was written durable: the fsyncs
// of both sync modes, and what a failed one leaves.

// file is the part of *os.File the writer uses; tests wrap it to inject faults.
type file interface {
	WriteAt(p []byte, off int64) (int, error)
	Sync() error
	Truncate(size int64) error
	Stat() (os.FileInfo, error)
	Close() error
}

// adopt locks osf and reads its tail to continue the chain.
func (l *Log) adopt(osf *os.File) error {
	fi, err := osf.Stat()
	if err != nil {
		return fmt.Errorf("audit: open: %w", err)
	}
	l.f = l.wrap(osf)
	if !fi.Mode().IsRegular() {
		// A device (tests use /dev/full): nothing to read back or lock.
		return nil
	}
	if err := syscall.Flock(int(osf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		return fmt.Errorf("audit: open: %s is in use by another process: %w", l.path, err)
	}
	end, last, err := readTail(osf, fi.Size())
	if err != nil {
		return fmt.Errorf("audit: open %s: %w", l.path, err)
	}
	if end < fi.Size() {
		if err := osf.Truncate(end); err != nil {
			return fmt.Errorf("audit: open: truncate partial last line: %w", err)
		}
		if err := osf.Sync(); err != nil {
			return fmt.Errorf("audit: open: %w", err)
		}
		l.truncatedTail = fi.Size() - end
	}
	l.off, l.syncedOff = end, end
	if last != nil {
		rec, reason := checkLine(last)
		if reason != "" {
			return fmt.Errorf("audit: open %s: last record is corrupt: %s", l.path, reason)
		}
		l.seq, l.prev = rec.Seq, rec.Hash
	}
	l.syncedSeq, l.syncedPrev, l.ackedOff = l.seq, l.prev, end
	return nil
}

// readTail returns the offset just past the last complete line and that line
// (without newline), or nil if there is none.
func readTail(f *os.File, size int64) (end int64, last []byte, err error) {
	if size == 0 {
		return 0, nil, nil
	}
	start := max(0, size-2*MaxRecord)
	buf := make([]byte, size-start)
	if _, err := f.ReadAt(buf, start); err != nil {
		return 0, nil, fmt.Errorf("read tail: %w", err)
	}
	n := len(buf)
	if buf[n-1] != '\n' {
		i := bytes.LastIndexByte(buf, '\n')
		if i < 0 && start > 0 {
			return 0, nil, errors.New("last line longer than MaxRecord")
		}
		n = i + 1 // 0 when the file holds only a partial first line
	}
	if n == 0 {
		return 0, nil, nil
	}
	line := buf[:n-1]
	j := bytes.LastIndexByte(line, '\n')
	if j < 0 && start > 0 {
		return 0, nil, errors.New("last line longer than MaxRecord")
	}
	return start + int64(n), line[j+1:], nil
}

// ready makes sure l.f is the file at l.path and ends at l.off.
func (l *Log) ready() error {
	if l.f == nil {
		return l.recreate()
	}
	fi, err := l.f.Stat()
	if err != nil {
		return fmt.Errorf("audit: stat log: %w", err)
	}
	st, _ := fi.Sys().(*syscall.Stat_t)
	if st != nil && st.Nlink == 0 {
		// Deleted: records since the last export are lost. Fail this
		// batch; the next one re-creates the file.
		l.f.Close()
		l.f, l.needMarker = nil, true
		l.dropUnsynced()
		answerSynced(l.waiting, ErrUnlinked) // written to the deleted file
		l.waiting = nil
		return ErrUnlinked
	}
	// The path is looked up again only when the watch saw its name change.
	if l.watch.changed() || !l.pathKnown {
		if rotated, err := l.checkPath(fi); err != nil || rotated {
			return err
		}
	}
	if !fi.Mode().IsRegular() {
		return nil
	}
	if fi.Size() != l.off {
		if !l.broken {
			return fmt.Errorf("%w: size %d, expected %d", ErrModified, fi.Size(), l.off)
		}
		// Drop the partial line a failed write left behind.
		if err := l.f.Truncate(l.off); err != nil {
			return fmt.Errorf("audit: truncate after failed write: %w", err)
		}
	}
	if l.syncFailed {
		return l.resync()
	}
	return nil
}

// checkPath makes sure l.path still names l.f, whose stat is fi; when the
// name is gone (rotated) it starts a new file there and reports true.
func (l *Log) checkPath(fi os.FileInfo) (rotated bool, _ error) {
	l.pathKnown = false
	pfi, err := os.Stat(l.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		// Renamed away (rotated) with the records intact: make what this
		// file holds durable, then start a new file.
		if err := l.syncBeforeClose(); err != nil {
			return false, err
		}
		l.f.Close()
		l.f, l.needMarker = nil, true
		l.fileGen++
		return true, l.recreate()
	case err != nil:
		return false, fmt.Errorf("audit: stat log path: %w", err)
	case !os.SameFile(fi, pfi):
		return false, ErrReplaced
	}
	l.pathKnown = true
	return false, nil
}

// syncBeforeClose makes the unsynced records of the log durable before
// its file is let go.
func (l *Log) syncBeforeClose() error {
	if l.interval == 0 {
		if l.broken {
			// What a failed write or fsync took back leaves with the
			// file neither as a partial line nor as records of failed
			// Appends that the chain goes on without.
			if err := l.f.Truncate(l.off); err != nil {
				return fmt.Errorf("audit: truncate before rotation: %w", err)
			}
			if err := l.f.Sync(); err != nil {
				return fmt.Errorf("audit: sync log: %w", err)
			}
			l.broken = false
		}
		return l.syncLocked()
	}
	if len(l.unsynced) == 0 {
		return nil
	}
	if l.syncFailed {
		return l.resync()
	}
	if err := l.f.Sync(); err != nil {
		l.syncFailed = true
		return fmt.Errorf("audit: sync log: %w", err)
	}
	l.syncs.Add(1)
	l.markSynced()
	return nil
}

// dropUnsynced forgets the unsynced records of a deleted file.
func (l *Log) dropUnsynced() {
	l.unsynced, l.syncedOff, l.syncFailed = nil, 0, false
	l.fileGen++
}

// recreate creates a new log file at l.path; the next write starts it with
// the EventRecreated marker continuing the chain.
func (l *Log) recreate() error {
	if err := os.MkdirAll(filepath.Dir(l.path), 0o700); err != nil {
		return fmt.Errorf("audit: re-create log: %w", err)
	}
	osf, err := os.OpenFile(l.path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return ErrReplaced
	}
	if err != nil {
		return fmt.Errorf("audit: re-create log: %w", err)
	}
	if err := syscall.Flock(int(osf.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		osf.Close()
		return fmt.Errorf("audit: re-create log: lock: %w", err)
	}
	if d, err := os.Open(filepath.Dir(l.path)); err == nil {
		err = d.Sync() // make the new directory entry durable
		d.Close()
		if err != nil {
			osf.Close()
			return fmt.Errorf("audit: re-create log: sync dir: %w", err)
		}
	}
	l.f, l.off, l.broken, l.needMarker = l.wrap(osf), 0, false, true
	l.pathKnown = false
	l.unsynced, l.syncedOff, l.syncFailed = l.unsynced[:0], 0, false
	l.syncedSeq, l.syncedPrev, l.ackedOff, l.markerUnsynced = l.seq, l.prev, 0, false
	l.fileGen++
	return nil
}

// armSync starts the SyncInterval timer when records wait for an fsync and
// it is not running: the first write after an fsync arms it. The caller
// holds wmu.
func (l *Log) armSync() {
	if l.interval > 0 && !l.syncArmed && len(l.unsynced) > 0 && !l.syncFailed {
		l.syncArmed = true
		l.syncDue.Reset(l.interval)
	}
}

// syncWritten fsyncs the records a SyncInterval log wrote since its last
// fsync. A failure puts the log in the failed state: the next batch must
// write them again and fsync before anything else is appended.
func (l *Log) syncWritten() {
	if len(l.unsynced) == 0 || l.syncFailed || l.f == nil {
		return
	}
	err := l.f.Sync()
	if err != nil {
		l.syncFailed = true
		l.failures.Add(1)
		l.mu.Lock()
		l.failure = fmt.Errorf("audit: sync log: %w", err)
		l.mu.Unlock()
		return
	}
	l.syncs.Add(1)
	l.markSynced()
	if cap(l.unsynced) > maxUnsynced {
		l.unsynced = nil
	}
}

// resync writes the log's unsynced records (either mode) again at their
// offset and fsyncs them: the recovery from a failed fsync, whose pages
// are of unknown state.
func (l *Log) resync() error {
	if _, err := l.f.WriteAt(l.unsynced, l.syncedOff); err != nil {
		return fmt.Errorf("audit: rewrite unsynced records: %w", err)
	}
	if err := l.f.Sync(); err != nil {
		return fmt.Errorf("audit: sync log: %w", err)
	}
	l.syncs.Add(1)
	l.syncFailed = false
	l.markSynced()
	return nil
}

// markSynced records that an fsync covered everything written. The
// caller holds wmu.
func (l *Log) markSynced() {
	l.unsynced, l.syncedOff = l.unsynced[:0], l.off
	l.syncedSeq, l.syncedPrev = l.seq, l.prev
	l.markerUnsynced = false
}

// syncWaiting fsyncs the SyncAlways records written so far and answers
// their callers: one fsync for every record written while the previous
// one ran (group commit). One runs at a time (syncing); it holds smu, not
// wmu, across the fsync, so that records are written meanwhile, and hands
// them to the writer goroutine when it is done.
func (l *Log) syncWaiting() {
	l.wmu.Lock()
	if l.syncing || len(l.waiting) == 0 {
		// The running fsync's owner looks at waiting again when it is
		// done: callers never queue behind it to find nothing to do.
		l.release() // an Append that found wmu taken left its record to us
		return
	}
	l.syncing = true
	batch := l.waiting
	l.waiting = nil
	f, gen, lost, end, seq, prev := l.f, l.fileGen, l.lostGen, l.off, l.seq, l.prev
	l.release()
	l.smu.Lock()
	defer l.smu.Unlock()
	err := ErrClosed
	if f != nil {
		err = f.Sync()
	}
	l.wmu.Lock()
	if l.syncedHook != nil {
		l.syncedHook()
	}
	switch {
	case gen != l.fileGen:
		// The file was let go meanwhile: rotated, after an fsync of
		// everything it held, or deleted, which that batch reported.
	case lost != l.lostGen:
		// Another fsync failed meanwhile: these records were taken back
		// or are to be written again; their callers fail with the rest.
		err = errors.New("audit: sync log: a concurrent fsync of the log failed")
	case err == nil:
		l.syncs.Add(1)
		if end > l.syncedOff {
			n := end - l.syncedOff
			l.unsynced = l.unsynced[:copy(l.unsynced, l.unsynced[n:])]
			l.syncedOff, l.syncedSeq, l.syncedPrev = end, seq, prev
			l.markerUnsynced = false // a new file's first record: before end
		}
	default:
		err = fmt.Errorf("audit: sync log: %w", err)
		l.syncLost(err)
	}
	l.syncing = false
	more := len(l.waiting) > 0
	l.release()
	answerSynced(batch, err)
	if more {
		// Written while this fsync ran: the writer goroutine's.
		select {
		case l.syncKick <- struct{}{}:
		default:
		}
	}
	if err != nil {
		l.failures.Add(1)
		l.mu.Lock()
		l.failure = err
		l.mu.Unlock()
	} else {
		l.records.Add(uint64(len(batch)))
	}
}

// syncLocked is syncWaiting for a caller that holds wmu (and no fsync
// runs without it: Close, rotation).
func (l *Log) syncLocked() error {
	if l.interval > 0 || (len(l.waiting) == 0 && len(l.unsynced) == 0) {
		return nil
	}
	batch := l.waiting
	l.waiting = nil
	var err error
	switch {
	case l.f == nil:
		err = ErrClosed
	case l.syncFailed:
		// After a failed fsync the pages are of unknown state: written
		// again, then fsynced (resync counts its fsync).
		err = l.resync()
	default:
		if err = l.f.Sync(); err == nil {
			l.syncs.Add(1)
			l.markSynced()
		} else {
			err = fmt.Errorf("audit: sync log: %w", err)
		}
	}
	if err == nil {
		l.records.Add(uint64(len(batch)))
	} else {
		l.failures.Add(1)
		l.syncLost(err)
	}
	answerSynced(batch, err)
	return err
}

// syncLost is what a failed fsync of SyncAlways records leaves: every
// record written since the last good fsync is of unknown state, so every
// caller still waiting for one fails. When none of those records was
// answered yet, they are taken back, as after a failed write: the next
// batch truncates the file to the last good fsync and their seqs are used
// again. When one was (AppendWritten: its call went on), nothing is taken
// back: they are written again from memory and fsynced before anything
// else is appended (resync), and their failed callers' records stay in
// the chain. The caller holds wmu.
func (l *Log) syncLost(err error) {
	l.lostGen++
	answerSynced(l.waiting, err)
	l.waiting = nil
	if l.ackedOff > l.syncedOff {
		l.syncFailed = true
		return
	}
	l.off, l.seq, l.prev = l.syncedOff, l.syncedSeq, l.syncedPrev
	l.unsynced = l.unsynced[:0]
	l.broken = true
	if l.markerUnsynced {
		l.needMarker = true
	}
}

// answerSynced answers the callers of records that waited for an fsync.
func answerSynced(batch []*request, err error) {
	for _, r := range batch {
		if err != nil {
			r.res = result{err: err}
		}
		r.done <- r.res
	}
}
