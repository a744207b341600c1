package egress

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// DNSStreamType is the Content-Type of a streaming POST /v1/dns: the
// request body is a sequence of DNS queries and the response body a
// sequence of answers, each a message with the two-byte length prefix of
// DNS over TCP (RFC 1035 4.2.2). Answers come back as they are ready, not
// in order; the client tells them apart by the DNS ID, so its in-flight
// queries on one stream must carry distinct IDs. The body is chunked HTTP
// like any other, so the socket's strict framing checks still apply.
//
// The stream is the in-sandbox stub's transport: one connection, one
// identity preamble and one HTTP request carry every question of a
// sandbox, instead of one HTTP request per question. Each question is
// answered exactly as a single POST /v1/dns (same policy, audit, guard and
// rcodes), for the caller the connection's preamble identified.
const DNSStreamType = "application/x-sluice-dns-stream"

const (
	// dnsStreamInflight bounds the questions of one stream being answered
	// at once; the stream is not read further until one finishes. The
	// stub keeps at most 64 UDP questions in flight over its two streams.
	dnsStreamInflight = 64
	// dnsSandboxInflight bounds the questions being answered at once on
	// all the streams of one sandbox (THREATS B): a sandbox that opens
	// many streams itself over its socket gets one worker per stream
	// beyond this, never 64 each.
	dnsSandboxInflight = 128
	// dnsStreamIdle closes a stream that has carried no question for this
	// long (the stub closes its own after a shorter idle time).
	dnsStreamIdle = 2 * time.Minute
	// dnsStreamReadBuf is the size of a stream's frame reader: more than
	// the largest frame (2+maxDNSMessage), so every frame can be peeked.
	dnsStreamReadBuf = 16 << 10
)

// serveDNSStream answers a DNSStreamType request until the client ends the
// body, sends a frame that is not a DNS message size, or goes idle, or the
// gateway shuts down (then the questions in flight are answered first). A
// malformed frame ends the stream (a stream cannot resynchronise); a
// malformed message inside a good frame is answered FORMERR like a single
// question.
func (e answerer) serveDNSStream(w http.ResponseWriter, r *http.Request, id wire.Identity) {
	ctx := r.Context()
	rc := http.NewResponseController(w)
	if err := rc.EnableFullDuplex(); err != nil {
		refusal.Write(w, refusal.New(http.StatusInternalServerError, refusal.SchemaViolation, "bug(): the connection cannot stream"), refusal.NewRequestID())
		return
	}
	w.Header().Set("Content-Type", DNSStreamType)
	w.Header().Set("Cache-Control", "no-store")
	// A stream ends when the handler does, often with its request body
	// unread (a bad frame, idle, shutdown): the connection then carries no
	// next request, and the client must not reuse it for one (a reused
	// connection's next request raced the discard of this body and could
	// be answered 400).
	w.Header().Set("Connection", "close")
	w.WriteHeader(http.StatusOK)
	// The stub sends Expect: 100-continue and waits for this head before
	// its first question (a gateway that refuses streams answers at once
	// instead of waiting for a body that never ends). An empty Write sends
	// the head as the final response: no 100 Continue follows it when the
	// body is read.
	if _, err := w.Write(nil); err != nil {
		return
	}
	if err := rc.Flush(); err != nil {
		return
	}
	out := &frameBatcher{write: func(b []byte) error {
		if _, err := w.Write(b); err != nil {
			return err
		}
		return rc.Flush()
	}}
	st := e.subs.state
	pool := &answerPool{
		answer: func(q []byte) { out.send(e.answer(ctx, refusal.NewRequestID(), id, q)) },
		take:   func(first bool) bool { return st.takeWorker(id.Sandbox, first) },
		put:    func() { st.putWorker(id.Sandbox) },
	}
	defer pool.wait()
	var tally dnsTally
	defer func() { tally.flush(e.Proxy); out.flush() }()
	// A graceful shutdown ends the stream: no question is read after it
	// began (a read waiting for one fails at once), those in flight are
	// answered (pool.wait), and the handler returns, which ends the
	// chunked body cleanly. The stub then fails what it still waits for
	// (REFUSED) and dials a new stream. Without this, Shutdown would wait
	// for the stream's idle time, far past its grace period.
	var stopping atomic.Bool
	defer e.d.OnStop(func() {
		stopping.Store(true)
		_ = rc.SetReadDeadline(time.Now())
	})()
	// However the handler ends, the server then discards what is left of
	// the request body, which never ends: with the read deadline the loop
	// set (dnsStreamIdle ahead) that would hold the connection, and a
	// shutdown, for minutes. A shutdown that began just before the loop
	// moved the deadline forward is the case this closes.
	defer func() { _ = rc.SetReadDeadline(time.Now()) }()
	// The buffer holds a whole frame of any allowed size, so a frame is
	// read in place (Peek) without a copy; dnsStreamReadBuf > 2+maxDNSMessage.
	br := bufio.NewReaderSize(r.Body, dnsStreamReadBuf)
	var ans []byte
	for {
		if !frameBuffered(br) {
			// The next read may wait: count and send the answers made
			// so far before waiting for more questions, and wait at
			// most dnsStreamIdle.
			tally.flush(e.Proxy)
			out.flush()
			_ = rc.SetReadDeadline(time.Now().Add(dnsStreamIdle))
		}
		// Checked after the deadline is set: the shutdown hook sets
		// stopping before it moves the deadline to now, so either this
		// sees it or the read below fails.
		if stopping.Load() {
			return
		}
		head, err := br.Peek(2)
		if err != nil {
			return
		}
		n := int(binary.BigEndian.Uint16(head))
		if n == 0 || n > maxDNSMessage {
			e.d.Log.Warn("dns stream: bad frame; stream closed", "sandbox", id.Sandbox, "agent", id.Agent, "frame_len", n)
			return
		}
		frame, err := br.Peek(2 + n)
		if err != nil {
			return
		}
		// q stays valid until the next read from br: answerFast is done
		// with it before then and pool.run gets a copy.
		q := frame[2:]
		_, _ = br.Discard(2 + n) // cannot fail: the bytes are buffered
		// The common question is answered here, from the caches
		// (dns_fast.go), and its answer rides with the next write;
		// any other goes to a worker.
		var ok bool
		if ans, ok = e.answerFast(ctx, id, q, ans[:0], &tally); ok {
			out.queue(ans)
			continue
		}
		if !pool.run(ctx, append([]byte(nil), q...)) {
			return
		}
	}
}

// frameBuffered reports whether br holds a whole length-prefixed frame,
// so that reading it cannot wait.
func frameBuffered(br *bufio.Reader) bool {
	n := br.Buffered()
	if n < 2 {
		return false
	}
	b, _ := br.Peek(2)
	return n >= 2+int(binary.BigEndian.Uint16(b))
}

// answerPool answers a stream's questions on at most dnsStreamInflight
// goroutines (and the sandbox's budget, dnsSandboxInflight, for all its
// streams) that are kept for the stream's life: a question goes to an
// idle worker, or to a new one while there are fewer than the limit, or
// waits for one. Kept workers keep their grown stacks (a goroutine per
// question spent much of its time growing a fresh stack), and a slow
// upstream question holds one worker, not the stream.
type answerPool struct {
	answer func(q []byte)
	take   func(first bool) bool // a worker from the sandbox's budget; the first one always
	put    func()

	jobs    chan []byte
	workers int
	wg      sync.WaitGroup
}

// run hands q to a worker; false if ctx ended first.
func (p *answerPool) run(ctx context.Context, q []byte) bool {
	if p.jobs == nil {
		p.jobs = make(chan []byte)
	}
	select {
	case p.jobs <- q:
		return true
	default:
	}
	if p.workers < dnsStreamInflight && p.take(p.workers == 0) {
		p.workers++
		p.wg.Add(1)
		go p.work(q)
		return true
	}
	select {
	case p.jobs <- q:
		return true
	case <-ctx.Done():
		return false
	}
}

func (p *answerPool) work(q []byte) {
	defer p.wg.Done()
	defer p.put()
	for {
		p.answer(q)
		var ok bool
		if q, ok = <-p.jobs; !ok {
			return
		}
	}
}

// wait ends the workers once they have answered what they hold.
func (p *answerPool) wait() {
	if p.jobs != nil {
		close(p.jobs)
	}
	p.wg.Wait()
}

// frameBatcher writes length-prefixed messages from many goroutines as few
// writes: a sender appends its frame and, if no write is under way,
// becomes the writer and writes everything queued until the queue is empty
// (frames queued meanwhile ride along in the next write). After a write
// error every later frame is dropped.
type frameBatcher struct {
	write func([]byte) error

	mu      sync.Mutex
	buf     []byte
	spare   []byte
	writing bool
	err     error
}

func (fb *frameBatcher) send(msg []byte) {
	if fb.queue(msg) {
		fb.flush()
	}
}

// queue appends msg's frame for the next write and reports whether it did
// (not after a write error, nor for a message no frame can carry).
func (fb *frameBatcher) queue(msg []byte) bool {
	if len(msg) == 0 || len(msg) > 0xffff {
		return false
	}
	fb.mu.Lock()
	defer fb.mu.Unlock()
	if fb.err != nil {
		return false
	}
	fb.buf = binary.BigEndian.AppendUint16(fb.buf, uint16(len(msg)))
	fb.buf = append(fb.buf, msg...)
	return true
}

// flush writes everything queued, unless a write is under way already
// (whose writer then writes it).
func (fb *frameBatcher) flush() {
	fb.mu.Lock()
	if fb.writing || fb.err != nil {
		fb.mu.Unlock()
		return
	}
	fb.writing = true
	for len(fb.buf) > 0 && fb.err == nil {
		b := fb.buf
		fb.buf = fb.spare[:0]
		fb.mu.Unlock()
		err := fb.write(b)
		fb.mu.Lock()
		fb.spare = b[:0]
		if err != nil {
			fb.err = errors.Join(errors.New("dns stream: write"), err)
		}
	}
	fb.writing = false
	fb.mu.Unlock()
}

// takeWorker takes one stream worker from sandbox's budget; first (a
// stream's first worker, without which it could not answer at all) is
// always granted.
func (st *dnsState) takeWorker(sandbox string, first bool) bool {
	st.workersMu.Lock()
	defer st.workersMu.Unlock()
	if !first && st.workers[sandbox] >= dnsSandboxInflight {
		return false
	}
	if st.workers == nil {
		st.workers = map[string]int{}
	}
	st.workers[sandbox]++
	return true
}

// putWorker gives a worker back to sandbox's budget.
func (st *dnsState) putWorker(sandbox string) {
	st.workersMu.Lock()
	defer st.workersMu.Unlock()
	if n := st.workers[sandbox] - 1; n > 0 {
		st.workers[sandbox] = n
	} else {
		delete(st.workers, sandbox)
	}
}
