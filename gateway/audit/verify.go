package audit

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"
)

// VerifyError says where the chain breaks.
type VerifyError struct {
	Line   int // 1-based
	Reason string
	// Unfinished is a last line without its newline that is the start of
	// the record that was due next (its seq, and its prev when it got that
	// far): a write cut short by a full disk or a crash, never acknowledged
	// to any caller, not an edit. Open removes such a line (any partial
	// last line) before it writes again; Bytes is its length.
	Unfinished bool
	Bytes      int
}

func (e *VerifyError) Error() string {
	return fmt.Sprintf("audit: verify: line %d: %s", e.Line, e.Reason)
}

// Verify reads a whole log and checks every hash, link and sequence number.
// It returns the number of records verified.
func Verify(r io.Reader) (int, error) {
	return VerifyFrom(r, 1, ZeroHash)
}

// VerifyFrom verifies a log whose first record has sequence number seq and
// links to prev: a file re-created after deletion or rotation, or a segment
// checked against an anchored hash. It returns the number of records
// verified before the first error.
func VerifyFrom(r io.Reader, seq uint64, prev string) (int, error) {
	br := bufio.NewReaderSize(r, MaxRecord)
	n := 0
	for {
		line, err := br.ReadSlice('\n')
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			return n, &VerifyError{Line: n + 1, Reason: fmt.Sprintf("line longer than %d bytes", MaxRecord)}
		case errors.Is(err, io.EOF):
			if len(line) > 0 {
				return n, tailBreak(line, n+1, seq, prev)
			}
			return n, nil
		case err != nil:
			return n, fmt.Errorf("audit: verify: read: %w", err)
		}
		rec, reason := checkLine(line[:len(line)-1])
		if reason == "" {
			reason = linkReason(rec.Seq, rec.Prev, seq, prev)
		}
		if reason != "" {
			return n, &VerifyError{Line: n + 1, Reason: reason}
		}
		n++
		seq, prev = seq+1, rec.Hash
	}
}

// tailBreak is why a last line without newline (line, the file's
// lineNo-th) ends the chain that was due to continue at seq/prev.
func tailBreak(line []byte, lineNo int, seq uint64, prev string) *VerifyError {
	if _, bad := checkLine(line); bad == "" && unfinishedRecord(line, seq, prev) {
		// Whole but for its newline: the writer writes both
		// at once, so either that write stopped one byte
		// short (and was refused) or the newline was removed.
		return &VerifyError{Line: lineNo, Unfinished: true, Bytes: len(line), Reason: fmt.Sprintf(
			"unfinished write: the last line is record seq %d whole but for its newline (%d bytes): a write that stopped one byte short, never acknowledged, or a newline removed since; the chain is intact up to here",
			seq, len(line))}
	}
	if unfinishedRecord(line, seq, prev) {
		return &VerifyError{Line: lineNo, Unfinished: true, Bytes: len(line), Reason: fmt.Sprintf(
			"unfinished write: the last %d bytes, without a newline, are the start of record seq %d, cut short (a full disk or a crash) and never acknowledged; not an edit of the chain, which is intact up to here",
			len(line), seq)}
	}
	return &VerifyError{Line: lineNo, Bytes: len(line), Reason: fmt.Sprintf(
		"partial last line without newline that is not the start of record seq %d (truncated or edited)", seq)}
}

var hashSuffix = []byte(`,"hash":"`)

// unfinishedRecord says whether line (the file's last bytes, with no
// newline) is the start of the record with sequence number seq linking to
// prev, as the writer encodes it (appendRecordHead): {"seq":N,"time":"T",
// "prev":"P" and then anything. A line that stops inside that head must
// be a prefix of it.
func unfinishedRecord(line []byte, seq uint64, prev string) bool {
	head := []byte(`{"seq":` + strconv.FormatUint(seq, 10) + `,"time":"`)
	if len(line) <= len(head) {
		return bytes.HasPrefix(head, line)
	}
	if !bytes.HasPrefix(line, head) {
		return false
	}
	rest := line[len(head):]
	q := bytes.IndexByte(rest, '"')
	if q < 0 { // cut inside the time
		return len(rest) <= len(time.RFC3339Nano) && len(bytes.Trim(rest, "0123456789-:.TZ+")) == 0
	}
	if _, err := time.Parse(time.RFC3339Nano, string(rest[:q])); err != nil {
		return false
	}
	link := []byte(`","prev":"` + prev + `"`)
	rest = rest[q:]
	if len(rest) <= len(link) {
		return bytes.HasPrefix(link, rest)
	}
	return bytes.HasPrefix(rest, link)
}

// checkLine decodes one line (without newline) and checks its own hash. It
// returns a non-empty reason if the line is not a self-consistent record.
func checkLine(line []byte) (Record, string) {
	// The line must end with ,"hash":"<64 hex>"} ; the canonical form is the
	// same bytes with the hash value emptied.
	const tail = 64 + len(`"}`)
	if len(line) < len(hashSuffix)+tail || !bytes.Equal(line[len(line)-tail-len(hashSuffix):len(line)-tail], hashSuffix) ||
		!bytes.HasSuffix(line, []byte(`"}`)) {
		return Record{}, "not a record: missing trailing hash field"
	}
	got := string(line[len(line)-tail : len(line)-2])
	var rec Record
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	dec.UseNumber()
	if err := dec.Decode(&rec); err != nil {
		return Record{}, "invalid JSON: " + err.Error()
	}
	if dec.More() || dec.InputOffset() != int64(len(line)) {
		return Record{}, "invalid JSON: trailing data"
	}
	if rec.Hash != got {
		return Record{}, "hash field is not the last key"
	}
	canon := make([]byte, 0, len(line)-tail+2)
	canon = append(canon, line[:len(line)-tail]...) // ends with "hash":"
	canon = append(canon, `"}`...)
	sum := sha256.Sum256(canon)
	if hex.EncodeToString(sum[:]) != got {
		return Record{}, "hash mismatch (record edited)"
	}
	return rec, ""
}
