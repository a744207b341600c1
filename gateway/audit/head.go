package audit

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// EventHeadAccepted is the record `sluice audit accept-head` appends when an
// operator accepts a log that no longer holds the head recorded elsewhere.
const EventHeadAccepted = "audit_head_accepted"

// Head names the last record of a chain: its Seq and its Hash. A head kept
// somewhere the log's writer cannot reach (the gateway's store, a signed
// checkpoint on another sink, an operator's notes) is what makes deleting
// the last records, or rewriting the whole file with a recomputed chain,
// detectable: the chain alone only proves the file is self-consistent.
type Head struct {
	Seq  uint64
	Hash string
}

// String is the SEQ:HASH form ParseHead reads.
func (h Head) String() string {
	if h.Seq == 0 {
		return "0:" + ZeroHash
	}
	return strconv.FormatUint(h.Seq, 10) + ":" + h.Hash
}

// ParseHead reads SEQ:HASH (a sequence number from 1 and the record's hex
// SHA-256).
func ParseHead(s string) (Head, error) {
	seqs, hash, ok := strings.Cut(s, ":")
	if !ok {
		return Head{}, fmt.Errorf("head %q: want SEQ:HASH", s)
	}
	seq, err := strconv.ParseUint(seqs, 10, 64)
	if err != nil || seq == 0 {
		return Head{}, fmt.Errorf("head %q: SEQ must be a record number from 1", s)
	}
	if !isHexHash(hash) {
		return Head{}, fmt.Errorf("head %q: HASH must be 64 lowercase hex digits", s)
	}
	return Head{Seq: seq, Hash: hash}, nil
}

func isHexHash(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Head returns the head the log has written so far (Seq 0 for an empty log).
func (l *Log) Head() Head {
	l.wmu.Lock()
	defer l.release() // an Append that found the lock taken left its record to us
	return Head{Seq: l.seq, Hash: l.prev}
}

// DurableHead fsyncs the log and returns its head: a head that a crash of
// the host cannot take back, so it is safe to record elsewhere.
func (l *Log) DurableHead() (Head, error) {
	l.wmu.Lock()
	defer l.release() // as in Head
	h := Head{Seq: l.seq, Hash: l.prev}
	if l.f == nil || l.broken || l.syncFailed {
		return Head{}, errors.New("audit: head: the log is not healthy")
	}
	if err := l.f.Sync(); err != nil {
		return Head{}, fmt.Errorf("audit: head: sync log: %w", err)
	}
	return h, nil
}

// HeadError says that a log does not reach or does not hold a recorded head.
type HeadError struct {
	Want   Head // the head recorded elsewhere
	Got    Head // the file's last record (Seq 0: none)
	Reason string
	// Truncated: the file ends before Want.Seq (otherwise it holds
	// another record there).
	Truncated bool
	// At is the hash of the file's record at Want.Seq when it is another.
	At string
}

func (e *HeadError) Error() string {
	return fmt.Sprintf("audit: the log %s (recorded head %s, file's head %s)", e.Reason, e.Want, e.Got)
}

// CheckHead reads the log at path and checks that it holds want: a record
// with want.Seq whose hash is want.Hash. A file that ends before want.Seq was
// truncated; one whose record at want.Seq has another hash was rewritten.
// It checks the own hash of that record and of the last one, and reads
// only the sequence numbers of the rest (Verify checks every record and
// link): the gateway runs it at every start, on logs of any size. A file
// that starts after want.Seq (re-created, see EventRecreated) does not hold
// that record: CheckHead reports it with ok false and no error, and the
// caller decides.
func CheckHead(path string, want Head) (got Head, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return Head{}, false, fmt.Errorf("audit: check head: %w", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil {
		return Head{}, false, fmt.Errorf("audit: check head: %w", err)
	} else if !fi.Mode().IsRegular() {
		// A device or FIFO holds no records to compare (and may never end).
		return Head{}, false, fmt.Errorf("audit: check head: %s is not a regular file", path)
	}
	br := bufio.NewReaderSize(f, MaxRecord)
	var (
		last, at []byte // the last line and the one at want.Seq
		first    uint64
		lastNo   int
		atNo     int
	)
	for line := 1; ; line++ {
		b, rerr := br.ReadSlice('\n')
		if errors.Is(rerr, io.EOF) {
			break // a partial last line is never a record
		}
		if errors.Is(rerr, bufio.ErrBufferFull) {
			return Head{}, false, &VerifyError{Line: line, Reason: fmt.Sprintf("line longer than %d bytes", MaxRecord)}
		}
		if rerr != nil {
			return Head{}, false, fmt.Errorf("audit: check head: read: %w", rerr)
		}
		seq, ok := lineSeq(b)
		if !ok {
			return Head{}, false, &VerifyError{Line: line, Reason: "not a record: does not start with its seq"}
		}
		if first == 0 {
			first = seq
		}
		if seq == want.Seq && at == nil {
			at, atNo = bytes.Clone(b[:len(b)-1]), line
		}
		last, lastNo = append(last[:0], b[:len(b)-1]...), line
	}
	if last != nil {
		rec, reason := checkLine(last)
		if reason != "" {
			return Head{}, false, &VerifyError{Line: lastNo, Reason: reason}
		}
		got = Head{Seq: rec.Seq, Hash: rec.Hash}
	}
	var atHash string
	if at != nil {
		rec, reason := checkLine(at)
		if reason != "" {
			return Head{}, false, &VerifyError{Line: atNo, Reason: reason}
		}
		atHash = rec.Hash
	}
	switch {
	case want.Seq == 0:
		return got, true, nil
	case at != nil && atHash == want.Hash:
		return got, true, nil
	case at != nil:
		return got, false, &HeadError{Want: want, Got: got, Reason: fmt.Sprintf("has another record at seq %d (hash %s): rewritten", want.Seq, atHash), At: atHash}
	case first > want.Seq:
		return got, false, nil
	default:
		return got, false, &HeadError{Want: want, Got: got, Reason: fmt.Sprintf("ends at seq %d, before the recorded seq %d: truncated", got.Seq, want.Seq), Truncated: true}
	}
}

// lineSeq reads the seq of a line without decoding it: every record line
// starts with {"seq":N, (Seq is the Record's first field).
func lineSeq(b []byte) (uint64, bool) {
	rest, ok := bytes.CutPrefix(b, []byte(`{"seq":`))
	if !ok {
		return 0, false
	}
	i := bytes.IndexByte(rest, ',')
	if i <= 0 || i > 20 {
		return 0, false
	}
	seq, err := strconv.ParseUint(string(rest[:i]), 10, 64)
	return seq, err == nil
}
