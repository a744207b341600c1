package dns

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	mdns "github.com/miekg/dns"
	"golang.org/x/net/ipv4"
)

// The UDP fast path of a Stub with a Stream: queries are read many at a
// time (recvmmsg), each plain query (ParseQuery) goes on a stream as it
// is, without a goroutine of its own, the frames of one read go to the
// gateway as one write, and the stream's reader turns each answer into
// the reply and sends the replies at hand many at a time (sendmmsg).
// Anything else — EDNS, other opcodes, malformed or unusual names, NOTIMP
// types, a gateway that refuses streams — takes the path of Answer.

const (
	// udpBatch is how many datagrams one read or write takes at most.
	udpBatch = 64
	// udpBufSize bounds a query read on the fast path's socket; a
	// longer datagram is answered FORMERR (the gateway takes at most
	// 4096 bytes; a plain query is at most 271).
	udpBufSize = 4096
)

// udpServer is one ServeUDP over a socket that reads and writes in
// batches.
type udpServer struct {
	s        *Stub
	pc       *ipv4.PacketConn
	inflight atomic.Int64 // fast-path questions sent and not yet answered
	cache    *answerCache // nil without Stub.CacheFor

	// rc sends replies of one size to one client as one UDP GSO send
	// while gso holds (udp_gso_linux.go).
	rc  syscall.RawConn
	gso atomic.Bool

	mu      sync.Mutex
	out     []ipv4.Message // replies queued
	spare   []ipv4.Message
	writing bool
	gsoBuf  []byte // the writer's
}

// udpWait is a fast-path question in flight: its client, the query as
// received (its ID is the client's) and the largest reply it takes. buf
// holds the query, and then the reply: one allocation per question.
type udpWait struct {
	srv   *udpServer
	addr  net.Addr
	query []byte
	max   int
	sent  time.Time
	buf   [mdns.MinMsgSize]byte
}

// batchConn returns pc as a batching IPv4 socket, or nil.
func batchConn(pc net.PacketConn) *ipv4.PacketConn {
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		return nil
	}
	la, ok := uc.LocalAddr().(*net.UDPAddr)
	if !ok || la.IP.To4() == nil {
		return nil
	}
	return ipv4.NewPacketConn(uc)
}

// serveBatch is ServeUDP on a batching socket; slow takes the queries
// that go the way of Answer.
func (s *Stub) serveBatch(ctx context.Context, pc net.PacketConn, bc *ipv4.PacketConn, slow func(q []byte, addr net.Addr)) error {
	u := &udpServer{s: s, pc: bc, rc: gsoConn(pc)}
	if s.CacheFor > 0 {
		u.cache = &answerCache{ttl: s.CacheFor}
	}
	u.gso.Store(u.rc != nil)
	timeout := orDefault(s.Timeout, DefaultTimeout)
	maxInflight := int64(orDefault(s.MaxInflight, DefaultMaxInflight))
	if s.Stream != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			// Questions the gateway never answers are REFUSED after
			// Timeout, as Forward's context bounds the slow path.
			t := time.NewTicker(max(timeout/4, 10*time.Millisecond))
			defer t.Stop()
			for {
				select {
				case <-done:
					return
				case now := <-t.C:
					s.Stream.expireUDP(now.Add(-timeout))
				}
			}
		}()
	}
	ms := make([]ipv4.Message, udpBatch)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, udpBufSize+1)}
	}
	for {
		n, err := bc.ReadBatch(ms, 0)
		if err != nil {
			if stop, serr := s.udpReadFailed(err); stop {
				return serr
			}
			continue
		}
		var st *stream
		if s.Stream != nil {
			// One stream per read: the read's frames go as one write.
			if st, err = s.Stream.streamFor(ctx, timeout); err != nil {
				s.logger().Debug("dns stream", "err", err)
			}
		}
		sent := false
		now := time.Now()
		for i := range ms[:n] {
			m := &ms[i]
			q := m.Buffers[0][:m.N]
			if len(q) < headerLen || q[2]&0x80 != 0 {
				continue // as Answer: nothing to answer
			}
			if m.N > udpBufSize {
				// Longer than any question the gateway takes.
				u.queue(s.pack(formErr(q), mdns.MinMsgSize), m.Addr)
				continue
			}
			pq, ok := ParseQuery(q)
			if ok {
				if out, hit := u.cache.answer(nil, &pq, q, now); hit {
					u.queue(out, m.Addr)
					continue
				}
			}
			if st == nil || !ok || notImplemented[pq.Type] {
				slow(append([]byte(nil), q...), m.Addr)
				continue
			}
			if u.inflight.Load() >= maxInflight {
				s.logger().Warn("dns udp dropped: too many queries in flight")
				continue
			}
			w := &udpWait{srv: u, addr: m.Addr, max: mdns.MinMsgSize, sent: now}
			w.query = append(w.buf[:0], q...) // a plain query is at most 271 bytes
			u.inflight.Add(1)
			if !st.queueUDP(w) {
				u.inflight.Add(-1)
				slow(w.query, m.Addr)
				continue
			}
			sent = true
		}
		if sent {
			st.flush()
		}
		u.flush()
	}
}

// deliver turns the stream's answer to w into w's reply and queues it.
// An answer in the shape the gateway's fast path writes, that fits, only
// gets the client's ID back; any other is unpacked and checked against
// the query in full, and truncated to fit, as Answer does.
func (u *udpServer) deliver(w *udpWait, ans []byte) {
	u.inflight.Add(-1)
	if plainAnswer(ans, w.query[headerLen:]) && len(ans) <= w.max && len(ans) <= len(w.buf) {
		if u.cache != nil {
			if q, ok := ParseQuery(w.query); ok {
				u.cache.store(&q, ans, time.Now())
			}
		}
		id := [2]byte{w.query[0], w.query[1]}
		out := append(w.buf[:0], ans...) // the query is not needed any more
		out[0], out[1] = id[0], id[1]
		w.query = nil
		u.queue(out, w.addr)
		return
	}
	req, resp := new(mdns.Msg), new(mdns.Msg)
	if err := req.Unpack(w.query); err != nil {
		u.s.logger().Error("bug(): dns fast path: query does not unpack", "err", err)
		return
	}
	var reply *mdns.Msg
	if err := resp.Unpack(ans); err != nil {
		reply = u.s.refuse(req, fmt.Errorf("dns: forward: unpack answer: %w", err))
	} else {
		resp.Id = req.Id // the stream-local ID is the stream's business
		if err := matches(req, resp); err != nil {
			reply = u.s.refuse(req, fmt.Errorf("dns: forward: %w", err))
		} else {
			reply = resp
		}
	}
	if b := u.s.pack(reply, w.max); b != nil {
		u.queue(b, w.addr)
	}
}

// refuseAll answers REFUSED to every question of ws (their stream ended
// or they waited too long) and sends the replies.
func refuseAll(ws []*udpWait, err error) {
	var srvs []*udpServer
	for _, w := range ws {
		u := w.srv
		u.inflight.Add(-1)
		if u.s.logger().Enabled(context.Background(), slog.LevelInfo) {
			u.s.logger().Info("dns refused", "name", string(AppendName(nil, w.query[headerLen:len(w.query)-4])), "reason", err.Error())
		}
		u.queue(refused(w.query), w.addr)
		if len(srvs) == 0 || srvs[len(srvs)-1] != u {
			srvs = append(srvs, u)
		}
	}
	for _, u := range srvs {
		u.flush()
	}
}

// refused is the REFUSED reply to a plain query, as SetRcode makes it:
// the query's ID, opcode, RD and CD, and its question.
func refused(query []byte) []byte {
	out := append([]byte(nil), query...)
	flags := binary.BigEndian.Uint16(query[2:4])
	binary.BigEndian.PutUint16(out[2:4], flagQR|flags&(flagRD|flagCD)|mdns.RcodeRefused)
	return out
}

// queue queues one reply for the next flush.
func (u *udpServer) queue(b []byte, addr net.Addr) {
	if b == nil {
		return
	}
	u.mu.Lock()
	u.out = append(u.out, ipv4.Message{Buffers: [][]byte{b}, Addr: addr})
	u.mu.Unlock()
}

// flush sends every queued reply, in batches, unless another goroutine is
// sending them already.
func (u *udpServer) flush() {
	u.mu.Lock()
	if u.writing {
		u.mu.Unlock()
		return
	}
	u.writing = true
	for len(u.out) > 0 {
		batch := u.out
		u.out = u.spare[:0]
		u.mu.Unlock()
		u.send(batch)
		clear(batch) // the replies go to the collector
		u.mu.Lock()
		u.spare = batch[:0]
	}
	u.writing = false
	u.mu.Unlock()
}

// maxGSOSegments bounds the datagrams of one GSO send (the kernel's
// UDP_MAX_SEGMENTS is 64 or more).
const maxGSOSegments = 64

// send sends the replies of ms (which it reorders). Replies of one size to
// one client go as one UDP GSO send where the kernel segments them; the
// rest go many to a sendmmsg.
func (u *udpServer) send(ms []ipv4.Message) {
	if u.gso.Load() && len(ms) > 1 {
		slices.SortFunc(ms, func(a, b ipv4.Message) int {
			if c := compareAddr(a.Addr, b.Addr); c != 0 {
				return c
			}
			return len(a.Buffers[0]) - len(b.Buffers[0])
		})
		rest := ms[:0]
		for i := 0; i < len(ms); {
			size := len(ms[i].Buffers[0])
			j := i + 1
			for j < len(ms) && j-i < maxGSOSegments && len(ms[j].Buffers[0]) == size && compareAddr(ms[i].Addr, ms[j].Addr) == 0 {
				j++
			}
			if j-i > 1 && u.sendGSO(ms[i:j], size) {
				i = j
				continue
			}
			rest = append(rest, ms[i:j]...) // rest never overtakes i
			i = j
		}
		ms = rest
	}
	for len(ms) > 0 {
		n, err := u.pc.WriteBatch(ms[:min(len(ms), udpBatch)], 0)
		if err != nil {
			u.s.logger().Debug("dns udp write", "err", err)
			n = max(n, 1) // skip the datagram that failed
		}
		ms = ms[n:]
	}
}

// sendGSO sends ms, replies of size bytes to one client, as one GSO send;
// false if the kernel cannot, and GSO is off from then on.
func (u *udpServer) sendGSO(ms []ipv4.Message, size int) bool {
	if ua, ok := ms[0].Addr.(*net.UDPAddr); !ok || ua.IP.To4() == nil {
		return false
	}
	b := u.gsoBuf[:0]
	for _, m := range ms {
		b = append(b, m.Buffers[0]...)
	}
	u.gsoBuf = b
	ok, err := sendGSO(u.rc, b, size, ms[0].Addr)
	if !ok {
		u.gso.Store(false)
		u.s.logger().Debug("dns udp: no UDP GSO; replies go one by one")
		return false
	}
	if err != nil {
		u.s.logger().Debug("dns udp write", "err", err)
	}
	return true
}

// compareAddr orders UDP addresses (address, then port).
func compareAddr(a, b net.Addr) int {
	ua, _ := a.(*net.UDPAddr)
	ub, _ := b.(*net.UDPAddr)
	if ua == nil || ub == nil {
		switch {
		case ua == nil && ub == nil:
			return 0
		case ua == nil:
			return -1
		}
		return 1
	}
	return ua.AddrPort().Compare(ub.AddrPort())
}
