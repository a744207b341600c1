package audit

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// Line is one record as Stream hands it over: the envelope decoded, the
// fields left as the bytes the line holds, for the reader to decode the
// few it wants once.
type Line struct {
	Seq       uint64          `json:"seq"`
	Time      time.Time       `json:"time"`
	Prev      string          `json:"prev"`
	RequestID string          `json:"request_id"`
	Event     string          `json:"event"`
	Replica   string          `json:"replica,omitempty"`
	Fields    json.RawMessage `json:"fields,omitempty"`
	Hash      string          `json:"hash"`
}

// checkLineLight makes checkLine's checks (one JSON value, the envelope's
// keys only, hash last and matching) without decoding the fields into a
// map: what it accepts, checkLine accepts. A line it refuses is checked
// again by checkLine, whose reason is the one reported.
func checkLineLight(line []byte, rec *Line) string {
	const tail = 64 + len(`"}`)
	ok := len(line) >= len(hashSuffix)+tail && bytes.Equal(line[len(line)-tail-len(hashSuffix):len(line)-tail], hashSuffix) &&
		bytes.HasSuffix(line, []byte(`"}`))
	if ok && envelope(line, rec) { // envelope.go: the writer's layout, without reflection
		ok = rec.Hash == string(line[len(line)-tail:len(line)-2])
	} else if ok {
		dec := json.NewDecoder(bytes.NewReader(line))
		dec.DisallowUnknownFields()
		ok = dec.Decode(rec) == nil && !dec.More() && dec.InputOffset() == int64(len(line)) &&
			(len(rec.Fields) == 0 || rec.Fields[0] == '{' || string(rec.Fields) == "null") &&
			rec.Hash == string(line[len(line)-tail:len(line)-2])
	}
	if ok {
		h := sha256.New()
		h.Write(line[:len(line)-tail])
		h.Write([]byte(`"}`))
		var sum [sha256.Size]byte
		var hx [2 * sha256.Size]byte
		hex.Encode(hx[:], h.Sum(sum[:0]))
		ok = string(hx[:]) == rec.Hash
	}
	if ok {
		return ""
	}
	_, reason := checkLine(line)
	if reason == "" { // cannot happen: the two accept the same lines
		reason = "bug(): record refused by the streaming check only"
	}
	return reason
}

// linkReason is why a self-consistent record does not continue the chain
// at seq/prev ("" when it does), in VerifyFrom's words.
func linkReason(gotSeq uint64, gotPrev string, seq uint64, prev string) string {
	switch {
	case gotSeq != seq:
		return fmt.Sprintf("seq %d, want %d (record deleted, inserted, duplicated or reordered)", gotSeq, seq)
	case gotPrev != prev:
		return "prev does not match the previous record's hash (chain broken)"
	}
	return ""
}

const streamBatch = 256

type lineBatch struct {
	first int // line number of lines[0]
	lines [][]byte
	recs  []Line
	bad   []string
	done  chan struct{}
}

// Stream verifies the log at path as Verify does (from seq 1, or from a
// re-creation marker the file starts with) in one pass: one goroutine
// reads lines and checks the links in order, workers goroutines check each
// line on its own (JSON, envelope, self-hash) and call fn with every line
// that passes. fn runs on the workers, concurrently and in no order, and
// may be called for lines past the first break, before that break is
// found: a caller that gets a Chain with a Break that is not Unfinished
// must discard what fn did (sluice policy replay reports the break and
// nothing else). rec and raw are valid only during the call. A line that
// does not pass its own checks, and an unfinished or partial last line,
// are never passed to fn. When Stream returns, no fn call is running.
func Stream(ctx context.Context, path string, workers int, fn func(worker, line int, rec *Line, raw []byte)) (Chain, error) {
	if workers < 1 {
		workers = 1
	}
	f, err := os.Open(path)
	if err != nil {
		return Chain{}, fmt.Errorf("audit: read: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Chain{}, fmt.Errorf("audit: read: %w", err)
	}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	work := make(chan *lineBatch, 2*workers)
	order := make(chan *lineBatch, 4*workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for b := range work {
				for i, raw := range b.lines {
					if b.bad[i] = checkLineLight(raw, &b.recs[i]); b.bad[i] == "" && ctx.Err() == nil {
						fn(w, b.first+i, &b.recs[i], raw)
					}
				}
				close(b.done)
			}
		}()
	}
	// The reader: whole lines in batches; what ends the file otherwise
	// (a line too long, a last line without newline, a read error) is
	// left in tail for the linker, which alone knows seq and prev there.
	var (
		tailLine  []byte
		tailLong  bool
		tailErr   error
		readerEnd = make(chan struct{})
	)
	go func() {
		defer close(readerEnd)
		defer close(order)
		defer close(work)
		br := bufio.NewReaderSize(io.NewSectionReader(f, 0, fi.Size()), MaxRecord)
		n := 0
		b := &lineBatch{first: 1}
		send := func() bool {
			if len(b.lines) == 0 {
				return true
			}
			b.recs, b.bad, b.done = make([]Line, len(b.lines)), make([]string, len(b.lines)), make(chan struct{})
			select {
			case order <- b:
			case <-ctx.Done():
				return false
			}
			select {
			case work <- b:
			case <-ctx.Done():
				close(b.done) // the linker may wait on it
				return false
			}
			b = &lineBatch{first: n + 1}
			return true
		}
		for {
			line, err := br.ReadSlice('\n')
			switch {
			case errors.Is(err, bufio.ErrBufferFull):
				tailLong = true
			case errors.Is(err, io.EOF):
				if len(line) > 0 {
					tailLine = bytes.Clone(line)
				}
			case err != nil:
				tailErr = err
			default:
				n++
				b.lines = append(b.lines, bytes.Clone(line[:len(line)-1]))
				if len(b.lines) == streamBatch && !send() {
					return
				}
				continue
			}
			send()
			return
		}
	}()
	var ch Chain
	seq, prev := uint64(1), ZeroHash
	brk := func(line int, reason string) {
		if ch.Break == nil {
			ch.Break = &VerifyError{Line: line, Reason: reason}
			stop()
		}
	}
	for b := range order {
		<-b.done
		if ch.Break != nil {
			continue
		}
		for i := range b.lines {
			line := b.first + i
			if b.bad[i] == "" && line == 1 && b.recs[i].Event == EventRecreated && b.recs[i].Seq > 1 {
				seq, prev, ch.FromMarker = b.recs[i].Seq, b.recs[i].Prev, true
			}
			reason := b.bad[i]
			if reason == "" {
				reason = linkReason(b.recs[i].Seq, b.recs[i].Prev, seq, prev)
			}
			if reason != "" {
				brk(line, reason)
				break
			}
			ch.Verified, ch.Lines = line, line
			ch.Head = Head{Seq: b.recs[i].Seq, Hash: b.recs[i].Hash}
			seq, prev = seq+1, b.recs[i].Hash
		}
	}
	<-readerEnd
	wg.Wait()
	if ch.Break == nil {
		next := ch.Verified + 1
		switch {
		case tailErr != nil:
			return ch, fmt.Errorf("audit: verify: read: %w", tailErr)
		case tailLong:
			ch.Break = &VerifyError{Line: next, Reason: fmt.Sprintf("line longer than %d bytes", MaxRecord)}
		case tailLine != nil:
			ch.Lines = next
			ch.Break = tailBreak(tailLine, next, seq, prev)
		}
	}
	if ch.Break == nil && ctx.Err() != nil {
		return ch, ctx.Err()
	}
	return ch, nil
}
