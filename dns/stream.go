package dns

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"
)

// StreamContentType is the Content-Type of the gateway's streaming
// POST /v1/dns: both bodies are sequences of DNS messages with the
// two-byte length prefix of DNS over TCP (RFC 1035 4.2.2); answers come
// back in any order and are matched by DNS ID.
const StreamContentType = "application/x-sluice-dns-stream"

// Defaults for the zero-value fields of StreamForwarder.
const (
	DefaultStreamConns = 2
	DefaultStreamIdle  = 30 * time.Second
)

const (
	// maxStreamPending bounds the questions in flight on one stream.
	maxStreamPending = 4096
	// streamWriteTimeout bounds one write to the gateway; a gateway that
	// stops reading fails the stream rather than blocking every question.
	streamWriteTimeout = 5 * time.Second
)

// errStreamClosed is what a question gets when its stream ends first;
// errStreamDead when the stream had ended before the question was sent.
var (
	errStreamClosed = errors.New("dns: stream: closed")
	errStreamDead   = errors.New("dns: stream: ended before the question was sent")
)

// StreamForwarder is a Stub's Forward over a few long-lived streams to the
// gateway instead of one HTTP request per question: each stream is one
// connection from Dial (which writes the identity preamble, so the stream
// carries exactly the caller the connection was opened for) and one
// chunked POST /v1/dns of StreamContentType. Questions are written as they
// come, in batches when they come together, and each gets a stream-local
// DNS ID so that questions of different clients with the same ID cannot be
// confused; the caller's ID is put back on the answer.
//
// A stream that fails (a write or read error, a gateway that does not
// answer 200 with StreamContentType, a frame too short to be a message)
// fails its questions in flight, which the Stub answers REFUSED; the next
// question dials a new stream. The zero value with Dial set is usable.
type StreamForwarder struct {
	// Dial connects to the gateway's socket with the identity preamble
	// already written.
	Dial func(ctx context.Context) (net.Conn, error)

	// Fallback, if set, answers questions while the gateway refuses
	// streams (an older gateway answers 415): the per-question POST. A
	// stream is refused before any question is sent on it, so no question
	// is ever sent both ways.
	Fallback func(ctx context.Context, query []byte) ([]byte, error)

	Conns       int           // streams used in turn; default DefaultStreamConns
	IdleTimeout time.Duration // a stream idle this long is replaced, not reused; default DefaultStreamIdle

	mu       sync.Mutex
	closed   bool
	next     int
	streams  []*stream
	noStream time.Time // streams were refused; until then use Fallback
}

// streamRetry is how long a refused stream sends questions to Fallback
// before a stream is tried again.
const streamRetry = 30 * time.Second

// errStreamRefused is a stream the gateway did not accept.
var errStreamRefused = errors.New("dns: stream: refused by the gateway")

// Forward sends one packed query and returns the packed answer, with the
// query's ID. It has the signature of Stub.Forward.
func (f *StreamForwarder) Forward(ctx context.Context, query []byte) ([]byte, error) {
	if len(query) < headerLen {
		return nil, errors.New("dns: stream: query shorter than a header")
	}
	if len(query) > 0xffff {
		return nil, errors.New("dns: stream: query too large")
	}
	for attempt := 0; ; attempt++ {
		s, err := f.get(ctx)
		if err != nil {
			return nil, err
		}
		if s == nil {
			return f.Fallback(ctx, query)
		}
		ans, err := s.exchange(ctx, query)
		if errors.Is(err, errStreamDead) && attempt == 0 {
			continue // the stream ended between get and exchange: once more on a fresh one
		}
		return ans, err
	}
}

// Close closes every stream; questions in flight fail. Forward after Close
// fails.
func (f *StreamForwarder) Close() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closed = true
	for _, s := range f.streams {
		if s != nil {
			s.fail(errStreamClosed)
		}
	}
	f.streams = nil
	return nil
}

// get returns a usable stream, taking the streams in turn and dialing
// where a slot is empty, dead or idle for too long; nil (and no error)
// while questions go to Fallback.
func (f *StreamForwarder) get(ctx context.Context) (*stream, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed {
		return nil, errors.New("dns: stream: forwarder closed")
	}
	if f.Dial == nil {
		return nil, errors.New("dns: stream: no dialer")
	}
	if f.Fallback != nil && time.Now().Before(f.noStream) {
		return nil, nil
	}
	if f.streams == nil {
		f.streams = make([]*stream, orDefault(f.Conns, DefaultStreamConns))
	}
	i := f.next % len(f.streams)
	f.next++
	s := f.streams[i]
	if s != nil && s.usable(time.Now(), orDefault(f.IdleTimeout, DefaultStreamIdle)) {
		return s, nil
	}
	if s != nil {
		s.fail(errStreamClosed)
	}
	c, err := f.Dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("dns: stream: dial: %w", err)
	}
	s, err = startStream(ctx, c)
	if err != nil {
		if errors.Is(err, errStreamRefused) && f.Fallback != nil {
			f.noStream = time.Now().Add(streamRetry)
			return nil, nil
		}
		return nil, err
	}
	f.streams[i] = s
	return s, nil
}

// streamFor is get for the Stub's UDP fast path, bounded by timeout: nil
// (and no error) while questions go to Fallback.
func (f *StreamForwarder) streamFor(ctx context.Context, timeout time.Duration) (*stream, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f.get(ctx)
}

// expireUDP answers REFUSED to the fast-path questions sent before
// deadline that have no answer yet.
func (f *StreamForwarder) expireUDP(deadline time.Time) {
	f.mu.Lock()
	streams := slices.Clone(f.streams)
	f.mu.Unlock()
	for _, s := range streams {
		if s != nil {
			s.expireUDP(deadline)
		}
	}
}

// stream is one connection carrying one streaming POST /v1/dns.
type stream struct {
	conn net.Conn

	mu       sync.Mutex
	pending  map[uint16]waiter
	nextID   uint16
	lastUsed time.Time
	dead     bool
	err      error // why the stream ended

	wmu     sync.Mutex
	wbuf    []byte
	wspare  []byte
	writing bool
}

// streamHead is the request head of every stream. Expect: 100-continue
// makes a gateway that refuses the stream answer at once rather than wait
// for the end of a body that has no end (RFC 9110 10.1.1).
const streamHead = "POST /v1/dns HTTP/1.1\r\nHost: sluice\r\nContent-Type: " + StreamContentType +
	"\r\nAccept: " + StreamContentType + "\r\nExpect: 100-continue\r\nTransfer-Encoding: chunked\r\n\r\n"

// startStream writes the request head on c, waits for the gateway's 200
// with StreamContentType and starts reading answers. Any other final
// answer is errStreamRefused.
func startStream(ctx context.Context, c net.Conn) (*stream, error) {
	deadline := time.Now().Add(streamWriteTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, streamHead); err != nil {
		c.Close()
		return nil, fmt.Errorf("dns: stream: write request: %w", err)
	}
	br := bufio.NewReaderSize(c, 32<<10)
	var resp *http.Response
	for {
		var err error
		if resp, err = http.ReadResponse(br, nil); err != nil {
			c.Close()
			return nil, fmt.Errorf("dns: stream: read response: %w", err)
		}
		if resp.StatusCode != http.StatusContinue {
			break
		}
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != StreamContentType {
		c.Close()
		return nil, fmt.Errorf("%w: %d %q", errStreamRefused, resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	_ = c.SetDeadline(time.Time{})
	s := &stream{conn: c, pending: map[uint16]waiter{}, lastUsed: time.Now()}
	go s.read(resp)
	return s, nil
}

func (s *stream) usable(now time.Time, idle time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return !s.dead && (len(s.pending) > 0 || now.Sub(s.lastUsed) < idle)
}

// exchange sends query under a stream-local ID and waits for its answer.
func (s *stream) exchange(ctx context.Context, query []byte) ([]byte, error) {
	ch := make(chan []byte, 1)
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return nil, errStreamDead
	}
	if len(s.pending) >= maxStreamPending {
		s.mu.Unlock()
		return nil, errors.New("dns: stream: too many questions in flight")
	}
	id := s.freeID()
	s.pending[id] = waiter{ch: ch}
	s.lastUsed = time.Now()
	s.mu.Unlock()

	if err := s.send(id, query); err != nil {
		s.fail(err)
		return nil, fmt.Errorf("dns: stream: %w", err)
	}
	select {
	case ans, ok := <-ch:
		if !ok {
			s.mu.Lock()
			err := s.err
			s.mu.Unlock()
			return nil, err
		}
		out := append([]byte(nil), ans...)
		copy(out[0:2], query[0:2])
		return out, nil
	case <-ctx.Done():
		s.mu.Lock()
		if s.pending[id].ch == ch {
			delete(s.pending, id)
		}
		s.mu.Unlock()
		return nil, fmt.Errorf("dns: stream: %w", ctx.Err())
	}
}

// freeID returns a stream-local ID no question in flight has; s.mu is held
// and fewer than maxStreamPending questions are in flight.
func (s *stream) freeID() uint16 {
	id := s.nextID
	for {
		if _, busy := s.pending[id]; !busy {
			break
		}
		id++
	}
	s.nextID = id + 1
	return id
}

// queueUDP registers w under a stream-local ID and queues its question
// (w.query) for the next flush; false if the stream has ended or is full.
func (s *stream) queueUDP(w *udpWait) bool {
	s.mu.Lock()
	if s.dead || len(s.pending) >= maxStreamPending {
		s.mu.Unlock()
		return false
	}
	id := s.freeID()
	s.pending[id] = waiter{udp: w}
	s.lastUsed = w.sent
	s.mu.Unlock()
	s.wmu.Lock()
	s.wbuf = appendFrame(s.wbuf, id, w.query)
	s.wmu.Unlock()
	return true
}

// expireUDP answers REFUSED to the UDP questions sent before deadline
// that have no answer yet, as Stub.Timeout bounds a forwarded question.
func (s *stream) expireUDP(deadline time.Time) {
	var late []*udpWait
	s.mu.Lock()
	for id, w := range s.pending {
		if w.udp != nil && w.udp.sent.Before(deadline) {
			late = append(late, w.udp)
			delete(s.pending, id)
		}
	}
	s.mu.Unlock()
	refuseAll(late, errors.New("dns: stream: no answer in time"))
}

func appendFrame(b []byte, id uint16, query []byte) []byte {
	b = binary.BigEndian.AppendUint16(b, uint16(len(query)))
	b = binary.BigEndian.AppendUint16(b, id)
	return append(b, query[2:]...)
}

// send queues one frame (query with ID id) and, unless another sender is
// writing already, writes every queued frame as one HTTP chunk, until the
// queue is empty.
func (s *stream) send(id uint16, query []byte) error {
	s.wmu.Lock()
	s.wbuf = appendFrame(s.wbuf, id, query)
	return s.flushLocked()
}

// flush writes every queued frame unless another sender is writing them
// already; a write error fails the stream.
func (s *stream) flush() {
	s.wmu.Lock()
	if err := s.flushLocked(); err != nil {
		s.fail(err)
	}
}

// flushLocked is flush with s.wmu held; it unlocks it.
func (s *stream) flushLocked() error {
	if s.writing {
		s.wmu.Unlock()
		return nil
	}
	s.writing = true
	var err error
	for len(s.wbuf) > 0 && err == nil {
		b := s.wbuf
		s.wbuf = s.wspare[:0]
		s.wmu.Unlock()
		err = s.writeChunk(b)
		s.wmu.Lock()
		s.wspare = b[:0]
	}
	s.writing = false
	s.wmu.Unlock()
	return err
}

func (s *stream) writeChunk(b []byte) error {
	var head [20]byte
	h := strconv.AppendInt(head[:0], int64(len(b)), 16)
	h = append(h, '\r', '\n')
	bufs := net.Buffers{h, b, []byte("\r\n")}
	_ = s.conn.SetWriteDeadline(time.Now().Add(streamWriteTimeout))
	_, err := bufs.WriteTo(s.conn)
	return err
}

// read hands each answer of resp's body to its question until the stream
// fails.
func (s *stream) read(resp *http.Response) {
	defer resp.Body.Close()
	body := bufio.NewReaderSize(resp.Body, 32<<10)
	var (
		lenBuf  [2]byte
		buf     = make([]byte, 0xffff)
		touched []*udpServer // UDP servers with replies queued since the last flush
	)
	defer func() {
		for _, u := range touched {
			u.flush()
		}
	}()
	for {
		if len(touched) > 0 && !frameBuffered(body) {
			// The next read may wait: send the replies queued so far
			// before waiting for more answers.
			for _, u := range touched {
				u.flush()
			}
			touched = touched[:0]
		}
		if _, err := io.ReadFull(body, lenBuf[:]); err != nil {
			s.fail(err)
			return
		}
		n := int(binary.BigEndian.Uint16(lenBuf[:]))
		if n < headerLen {
			s.fail(fmt.Errorf("answer frame of %d bytes", n))
			return
		}
		msg := buf[:n]
		if _, err := io.ReadFull(body, msg); err != nil {
			s.fail(err)
			return
		}
		id := binary.BigEndian.Uint16(msg[0:2])
		s.mu.Lock()
		w, ok := s.pending[id]
		delete(s.pending, id)
		s.mu.Unlock()
		switch {
		case !ok:
			// An unknown ID answers a question that gave up (its
			// context ended); it is dropped.
		case w.ch != nil:
			w.ch <- append([]byte(nil), msg...) // buffered; each question gets at most one answer
		case w.udp != nil:
			u := w.udp.srv
			u.deliver(w.udp, msg)
			if !slices.Contains(touched, u) {
				touched = append(touched, u)
			}
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

// fail marks the stream dead, closes its connection and fails every
// question in flight.
func (s *stream) fail(err error) {
	s.mu.Lock()
	if s.dead {
		s.mu.Unlock()
		return
	}
	s.dead = true
	s.err = fmt.Errorf("%w: %w", errStreamClosed, err)
	pending := s.pending
	s.pending = map[uint16]waiter{}
	s.mu.Unlock()
	s.conn.Close()
	var udp []*udpWait
	for _, w := range pending {
		if w.ch != nil {
			close(w.ch)
		} else if w.udp != nil {
			udp = append(udp, w.udp)
		}
	}
	refuseAll(udp, s.err)
}

// waiter is a question in flight on a stream: either a Forward waiting
// on ch, or a UDP question of the Stub's fast path (stub_udp.go), whose
// answer goes straight to its client.
type waiter struct {
	ch  chan []byte
	udp *udpWait
}
