package audit

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// Entry is one line of a log file as Scan reads it.
type Entry struct {
	Line int // 1-based
	// Record is the line decoded (Fields numbers as json.Number), also when
	// its hash or link is wrong: an edited record is still shown, marked
	// unverified. Zero when Err is set.
	Record Record
	// Raw is the line without its newline; valid only during the callback.
	Raw []byte
	// Verified says the chain verifies from the file's first record
	// through this line.
	Verified bool
	// Err says why the line is not a record at all (not JSON, too long);
	// "" when Record is decoded.
	Err string
}

// Chain is what Scan found of a file's chain.
type Chain struct {
	Lines    int  // lines read (the unfinished last line included)
	Verified int  // lines that verify, from the first
	Head     Head // the last verified record; {0, ZeroHash} when none
	// Break is the first line that does not verify; nil when all do. An
	// unfinished last write (Break.Unfinished) is not tampering.
	Break *VerifyError
	// FromMarker says the file starts with an audit_log_recreated record:
	// it continues a chain whose earlier records are in another file.
	FromMarker bool
}

// Scan reads the log at path: it verifies the chain as Verify does (from
// seq 1, or from a re-creation marker the file starts with) and then calls
// fn with every line in order, each saying whether the chain verifies
// through it. A line that is not a record is passed with Err set, never
// dropped. Readers (the review UI, `sluice audit session`) use it; it
// never writes and takes no lock, so it reads a log the gateway is
// appending to, up to where it was when Scan opened it.
func Scan(path string, fn func(e Entry)) (Chain, error) {
	f, size, ch, err := openVerified(path)
	if err != nil {
		return Chain{}, err
	}
	defer f.Close()
	n := ch.Verified
	ch.Head = Head{Hash: ZeroHash}
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), MaxRecord)
	for line := 1; ; line++ {
		raw, err := r.ReadSlice('\n')
		if len(raw) == 0 && errors.Is(err, io.EOF) {
			break
		}
		e := Entry{Line: line, Verified: line <= n}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			e.Err = fmt.Sprintf("line longer than %d bytes", MaxRecord)
			e.Raw = bytes.Clone(raw[:256])
			for errors.Is(err, bufio.ErrBufferFull) { // skip the rest of it
				_, err = r.ReadSlice('\n')
			}
		case err != nil && !errors.Is(err, io.EOF):
			return ch, fmt.Errorf("audit: read: %w", err)
		default:
			e.Raw = bytes.TrimSuffix(raw, []byte("\n"))
			dec := json.NewDecoder(bytes.NewReader(e.Raw))
			dec.UseNumber()
			if derr := dec.Decode(&e.Record); derr != nil {
				e.Err, e.Record = "not a record: "+derr.Error(), Record{}
			}
			if errors.Is(err, io.EOF) && e.Err == "" {
				e.Err = "unfinished last line (no newline)"
				e.Record = Record{}
			}
		}
		ch.Lines = line
		if e.Verified {
			ch.Head = Head{Seq: e.Record.Seq, Hash: e.Record.Hash}
		}
		fn(e)
		if errors.Is(err, io.EOF) {
			break
		}
	}
	return ch, nil
}

// String is a one-line statement of what the chain proves, for people.
func (c Chain) String() string {
	switch {
	case c.Break != nil && c.Break.Unfinished:
		return fmt.Sprintf("%d records verify (head %s); line %d is an unfinished write, not tampering: the gateway's next start removes it",
			c.Verified, c.Head, c.Break.Line)
	case c.Break != nil:
		return fmt.Sprintf("BROKEN at line %d: %s; the %d records before it verify (head %s)", c.Break.Line, c.Break.Reason, c.Verified, c.Head)
	}
	return fmt.Sprintf("%d records verify, head %s", c.Verified, c.Head)
}

// Lines verifies the log at path as Scan does and then calls fn with each
// line that verifies (without its newline; raw is valid only during the
// call), in order, stopping at fn's first error. Nothing past the
// verified part is passed: the caller reads Chain.Break to say why it
// stopped; its Head is not filled in. It decodes nothing, so a reader that wants a few fields of
// many records (`sluice policy replay`) pays only for those.
func Lines(path string, fn func(line int, raw []byte) error) (Chain, error) {
	f, size, ch, err := openVerified(path)
	if err != nil {
		return Chain{}, err
	}
	defer f.Close()
	n := ch.Verified
	r := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), MaxRecord)
	for line := 1; line <= n; line++ {
		raw, err := r.ReadSlice('\n')
		if err != nil {
			return ch, fmt.Errorf("audit: read line %d: %w", line, err)
		}
		raw = bytes.TrimSuffix(raw, []byte("\n"))
		ch.Lines = line
		if err := fn(line, raw); err != nil {
			return ch, err
		}
	}
	return ch, nil
}

// verifyFile opens the log at path and verifies its chain as Verify does
// (from seq 1, or from a re-creation marker the file starts with). It
// returns the open file and the size the chain was verified to: a reader's
// second pass reads the same bytes, even while the gateway appends.
func openVerified(path string) (*os.File, int64, Chain, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, Chain{}, fmt.Errorf("audit: read: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, Chain{}, fmt.Errorf("audit: read: %w", err)
	}
	size := fi.Size()
	seq, prev := uint64(1), ZeroHash
	var ch Chain
	br := bufio.NewReaderSize(io.NewSectionReader(f, 0, size), 64<<10)
	if first, err := br.ReadSlice('\n'); err == nil || errors.Is(err, io.EOF) || errors.Is(err, bufio.ErrBufferFull) {
		var head Record
		if json.Unmarshal(bytes.TrimSuffix(first, []byte("\n")), &head) == nil && head.Event == EventRecreated && head.Seq > 1 {
			seq, prev, ch.FromMarker = head.Seq, head.Prev, true
		}
	}
	n, err := VerifyFrom(io.NewSectionReader(f, 0, size), seq, prev)
	var ve *VerifyError
	switch {
	case errors.As(err, &ve):
		ch.Break = ve
	case err != nil:
		f.Close()
		return nil, 0, Chain{}, fmt.Errorf("audit: read: %w", err)
	}
	ch.Verified = n
	return f, size, ch, nil
}
