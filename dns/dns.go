// Package dns holds sluice's DNS pieces: the stub that answers inside a
// sandbox's network namespace (served from the host side by sandboxd) and
// forwards every question to the gateway's policy answerer. It imports no
// other package of sluice.
//
// The stub never resolves anything itself. It parses each query strictly,
// answers FORMERR for what it cannot parse or for more than one question,
// NOTIMP for other opcodes and for TXT, NULL, ANY and transfer questions
// (THREATS C7: tunnel carriers), and otherwise hands a re-packed, canonical copy of the query to Forward.
// On the UDP fast path (Stub.Stream, stub_udp.go) a plain query goes to the
// gateway as received: ParseQuery accepts only queries that are already in
// that canonical form (miekg repacks them byte for byte), and everything
// else takes the path above.
// Every failure to get a usable answer from Forward (an error, a gateway
// that does not answer 200, an answer that does not parse or does not match
// the query's ID and question) becomes REFUSED: the sandbox learns nothing
// from a broken path, and no name is ever resolved outside policy.
//
// StreamForwarder is the Forward sandboxd's relay gives the stub: every
// question of a sandbox travels over a few long-lived, identity-stamped
// connections as one streaming POST /v1/dns each (StreamContentType),
// rather than one HTTP request per question; the gateway decides and
// audits each question exactly as a single POST.
//
// Resolver is the gateway's side: the one resolver raw egress asks, for
// the policy answerer and for the guarded dialer alike, so that the
// address dialled is one the answerer would also have classified. It
// resolves and caches and decides nothing; policy and the dial-time
// address check stay with the gateway.
package dns

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"time"

	mdns "github.com/miekg/dns"
)

// Defaults for the zero-value fields of Stub.
const (
	DefaultTimeout     = 5 * time.Second
	DefaultMaxInflight = 64
	DefaultMaxTCPConns = 16
	DefaultTCPIdle     = 10 * time.Second
)

// notImplemented are the question types the stub answers NOTIMP itself,
// without forwarding: TXT and NULL carry arbitrary bytes, ANY asks for
// everything, AXFR/IXFR/MAILB/MAILA are transfers and obsolete meta-queries.
var notImplemented = map[uint16]bool{
	mdns.TypeTXT:   true,
	mdns.TypeNULL:  true,
	mdns.TypeANY:   true,
	mdns.TypeAXFR:  true,
	mdns.TypeIXFR:  true,
	mdns.TypeMAILB: true,
	mdns.TypeMAILA: true,
}

// headerLen is the fixed DNS header; shorter datagrams carry no ID to answer.
const headerLen = 12

// Stub answers DNS queries by forwarding them to Forward. Its zero value
// (with Forward set) is usable.
type Stub struct {
	// Forward sends one packed query and returns the packed answer. An
	// error (for example the gateway's 404 before it answers DNS) makes the
	// stub answer REFUSED.
	Forward func(ctx context.Context, query []byte) ([]byte, error)
	Logger  *slog.Logger

	// Stream, if set, is the StreamForwarder behind Forward. ServeUDP
	// then sends plain queries (ParseQuery) on its streams directly,
	// many to a write, and answers them from its reader, many to a
	// write, instead of one goroutine, Forward and two syscalls each;
	// every other query still goes through Forward.
	Stream *StreamForwarder

	// CacheFor, if positive, lets the UDP fast path reuse the gateway's
	// positive answers to A and AAAA questions for that long, never past
	// their TTL (answerCache says what is kept and why that is safe).
	CacheFor time.Duration

	Timeout     time.Duration // per query, for Forward; default DefaultTimeout
	MaxInflight int           // UDP queries being answered at once (on the Stream fast path, and through Forward); more are dropped; default DefaultMaxInflight
	MaxTCPConns int           // TCP connections at once; more are closed; default DefaultMaxTCPConns
	TCPIdle     time.Duration // a TCP connection idle this long is closed; default DefaultTCPIdle
}

func (s *Stub) logger() *slog.Logger {
	if s.Logger != nil {
		return s.Logger
	}
	return slog.New(slog.DiscardHandler)
}

func orDefault[T int | time.Duration](v, d T) T {
	if v > 0 {
		return v
	}
	return d
}

// Answer returns the packed reply to one packed query, or nil when there is
// nothing to answer (fewer bytes than a header, or a message that is itself
// a response). maxSize bounds the reply (0 = 65535); a larger answer is
// truncated with TC set, as for UDP.
func (s *Stub) Answer(ctx context.Context, query []byte, maxSize int) []byte {
	if len(query) < headerLen {
		return nil
	}
	// Never answer responses: two stubs (or a spoofed source) must not be
	// able to bounce messages between each other.
	if query[2]&0x80 != 0 {
		return nil
	}
	req := new(mdns.Msg)
	if err := req.Unpack(query); err != nil {
		return s.pack(formErr(query), maxSize)
	}
	reply := s.answer(ctx, req)
	if reply == nil {
		return nil
	}
	if maxSize <= 0 {
		maxSize = mdns.MaxMsgSize
	}
	if opt := req.IsEdns0(); opt != nil && maxSize < mdns.MaxMsgSize {
		maxSize = max(maxSize, min(int(opt.UDPSize()), mdns.MaxMsgSize))
	}
	return s.pack(reply, maxSize)
}

// formErr builds a FORMERR reply from the raw header of a message that
// did not parse: same ID and opcode, no sections.
func formErr(query []byte) *mdns.Msg {
	m := new(mdns.Msg)
	m.Id = binary.BigEndian.Uint16(query[0:2])
	m.Response = true
	m.Opcode = int(query[2]>>3) & 0xF
	m.RecursionDesired = query[2]&0x01 != 0
	m.Rcode = mdns.RcodeFormatError
	return m
}

func (s *Stub) answer(ctx context.Context, req *mdns.Msg) *mdns.Msg {
	switch {
	case req.Opcode != mdns.OpcodeQuery:
		return new(mdns.Msg).SetRcode(req, mdns.RcodeNotImplemented)
	case len(req.Question) != 1, len(req.Answer) != 0, len(req.Ns) != 0:
		// RFC 9619: a query carries exactly one question and no
		// answer or authority records.
		return new(mdns.Msg).SetRcodeFormatError(req)
	}
	q := req.Question[0]
	if notImplemented[q.Qtype] {
		// THREATS C7: the bulk-data types are the usual DNS tunnel
		// carriers; they never leave the sandbox, whatever policy says.
		return new(mdns.Msg).SetRcode(req, mdns.RcodeNotImplemented)
	}
	canon, err := req.Pack()
	if err != nil {
		return new(mdns.Msg).SetRcodeFormatError(req)
	}
	if s.Forward == nil {
		return s.refuse(req, errors.New("dns: forward: no forwarder"))
	}
	fctx, cancel := context.WithTimeout(ctx, orDefault(s.Timeout, DefaultTimeout))
	defer cancel()
	raw, err := s.Forward(fctx, canon)
	if err != nil {
		return s.refuse(req, fmt.Errorf("dns: forward: %w", err))
	}
	resp := new(mdns.Msg)
	if err := resp.Unpack(raw); err != nil {
		return s.refuse(req, fmt.Errorf("dns: forward: unpack answer: %w", err))
	}
	if err := matches(req, resp); err != nil {
		return s.refuse(req, fmt.Errorf("dns: forward: %w", err))
	}
	s.logger().Debug("dns answer", "name", q.Name, "qtype", mdns.TypeToString[q.Qtype], "rcode", mdns.RcodeToString[resp.Rcode])
	return resp
}

// matches checks that resp answers req: a response, the same ID and the same
// single question (names compared case-insensitively, RFC 4343).
func matches(req, resp *mdns.Msg) error {
	if !resp.Response {
		return errors.New("answer is not a response")
	}
	if resp.Id != req.Id {
		return fmt.Errorf("answer id %d does not match query id %d", resp.Id, req.Id)
	}
	if resp.Opcode != req.Opcode {
		return errors.New("answer opcode does not match")
	}
	if len(resp.Question) != 1 {
		return fmt.Errorf("answer has %d questions", len(resp.Question))
	}
	q, a := req.Question[0], resp.Question[0]
	if !strings.EqualFold(q.Name, a.Name) || q.Qtype != a.Qtype || q.Qclass != a.Qclass {
		return errors.New("answer question does not match")
	}
	return nil
}

func (s *Stub) refuse(req *mdns.Msg, err error) *mdns.Msg {
	q := req.Question[0]
	s.logger().Info("dns refused", "name", q.Name, "qtype", mdns.TypeToString[q.Qtype], "reason", err.Error())
	return new(mdns.Msg).SetRcode(req, mdns.RcodeRefused)
}

func (s *Stub) pack(m *mdns.Msg, maxSize int) []byte {
	if maxSize > 0 {
		m.Truncate(maxSize)
	}
	b, err := m.Pack()
	if err != nil {
		s.logger().Error("bug(): dns pack reply", "err", err)
		return nil
	}
	return b
}

// ServeUDP answers queries on pc until pc is closed; it then waits for the
// queries in flight and returns nil. At most MaxInflight queries are
// answered at once, each by a goroutine kept for the next query (a fresh
// goroutine per query spent much of its time growing its stack); a query
// that arrives while all of them are busy is dropped.
func (s *Stub) ServeUDP(pc net.PacketConn) error {
	ctx, cancel := context.WithCancel(context.Background())
	type job struct {
		q    []byte
		addr net.Addr
	}
	var (
		wg      sync.WaitGroup
		jobs    = make(chan job)
		workers int
	)
	defer func() { cancel(); close(jobs); wg.Wait() }()
	work := func(j job) {
		defer wg.Done()
		for ok := true; ok; j, ok = <-jobs {
			if b := s.Answer(ctx, j.q, mdns.MinMsgSize); b != nil {
				if _, err := pc.WriteTo(b, j.addr); err != nil {
					s.logger().Debug("dns udp write", "err", err)
				}
			}
		}
	}
	maxWorkers := orDefault(s.MaxInflight, DefaultMaxInflight)
	slow := func(q []byte, addr net.Addr) {
		j := job{q: q, addr: addr}
		select {
		case jobs <- j: // an idle worker took it
			return
		default:
		}
		if workers < maxWorkers {
			workers++
			wg.Add(1)
			go work(j)
			return
		}
		select {
		case jobs <- j:
		default:
			s.logger().Warn("dns udp dropped: too many queries in flight")
		}
	}
	if bc := batchConn(pc); bc != nil {
		return s.serveBatch(ctx, pc, bc, slow) // stub_udp.go
	}
	buf := make([]byte, mdns.MaxMsgSize)
	for {
		n, addr, err := pc.ReadFrom(buf)
		if err != nil {
			if stop, serr := s.udpReadFailed(err); stop {
				return serr
			}
			continue
		}
		slow(append([]byte(nil), buf[:n]...), addr)
	}
}

// ServeTCP answers length-prefixed queries (RFC 1035 4.2.2) on connections
// accepted from l until l is closed; it then closes the open connections,
// waits for them and returns nil.
func (s *Stub) ServeTCP(l net.Listener) error {
	ctx, cancel := context.WithCancel(context.Background())
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns = map[net.Conn]struct{}{}
	)
	defer func() {
		cancel()
		mu.Lock()
		for c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	}()
	sem := make(chan struct{}, orDefault(s.MaxTCPConns, DefaultMaxTCPConns))
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("dns: serve tcp: %w", err)
			}
			s.logger().Debug("dns tcp accept", "err", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		select {
		case sem <- struct{}{}:
		default:
			s.logger().Warn("dns tcp refused: too many connections")
			c.Close()
			continue
		}
		mu.Lock()
		conns[c] = struct{}{}
		mu.Unlock()
		wg.Add(1)
		go func() {
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				c.Close()
				<-sem
				wg.Done()
			}()
			s.serveConn(ctx, c)
		}()
	}
}

func (s *Stub) serveConn(ctx context.Context, c net.Conn) {
	idle := orDefault(s.TCPIdle, DefaultTCPIdle)
	var lenBuf [2]byte
	for {
		c.SetDeadline(time.Now().Add(idle))
		if _, err := io.ReadFull(c, lenBuf[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint16(lenBuf[:])
		q := make([]byte, n)
		if _, err := io.ReadFull(c, q); err != nil {
			return
		}
		b := s.Answer(ctx, q, 0)
		if b == nil {
			// Nothing sensible to say; a stream cannot resynchronise.
			return
		}
		out := make([]byte, 2+len(b))
		binary.BigEndian.PutUint16(out, uint16(len(b)))
		copy(out[2:], b)
		c.SetDeadline(time.Now().Add(idle))
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// udpReadFailed says what a failed UDP read means for ServeUDP: the
// socket closed (stop, nil), a deadline passed (stop, the error), or a
// transient error such as an ICMP-induced ECONNREFUSED (logged; the stub
// keeps reading).
func (s *Stub) udpReadFailed(err error) (stop bool, _ error) {
	if errors.Is(err, net.ErrClosed) {
		return true, nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return true, fmt.Errorf("dns: serve udp: %w", err)
	}
	s.logger().Debug("dns udp read", "err", err)
	return false, nil
}
