package dns

import (
	"encoding/binary"
	"sync"
	"time"
)

// DefaultCacheFor is how long the sandbox relay's stub reuses an allowed
// answer (sandboxd/relay).
const DefaultCacheFor = time.Second

// maxCached bounds the answers a stub keeps; when it is full the expired
// ones go, and if none has expired, all of them.
const maxCached = 4096

// answerCache keeps the gateway's positive answers to plain A and AAAA
// questions for a short time, so that a sandbox asking the same name over
// and over (a package manager, a retry loop) is answered by its own stub
// instead of a round trip to the gateway for each question.
//
// What it keeps is only what the gateway already allowed this sandbox to
// know: answers in the plain shape (plainAnswer) with rcode NOERROR, at
// least one address and no record with TTL 0. Refusals, NXDOMAIN, empty
// answers and everything else are asked again every time, so every refusal
// is still decided and audited by the gateway, and a new name — what an
// exfiltration through DNS needs — always reaches the gateway's signals.
// An answer is kept for at most for (the stub's CacheFor), never past
// its records' TTL: after a policy change a sandbox may get an answer it
// had a moment before; it still reaches nothing without the proxy's own
// decision on every connection.
type answerCache struct {
	ttl time.Duration

	mu sync.Mutex
	m  map[string]cachedAnswer
}

type cachedAnswer struct {
	ans     []byte // the gateway's answer, as AppendAnswer writes it
	expires time.Time
}

// cacheKey is the question's name with ASCII letters in lower case, then
// its type and class: the question section of a plain query, folded.
func cacheKey(dst []byte, q *Question) []byte {
	for _, c := range q.Name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	dst = binary.BigEndian.AppendUint16(dst, q.Type)
	return binary.BigEndian.AppendUint16(dst, q.Class)
}

// store keeps ans, if it may be reused. ans must be a plainAnswer to the
// plain query q (the stub's deliver has checked it).
func (c *answerCache) store(q *Question, ans []byte, now time.Time) {
	if c == nil || (q.Type != 1 && q.Type != 28) || q.Class != 1 || ans[3]&0xf != 0 {
		return
	}
	qsec := len(q.Name) + 4
	n := int(binary.BigEndian.Uint16(ans[6:8]))
	if n == 0 {
		return
	}
	keep := c.ttl
	off := headerLen + qsec
	for range n {
		ttl := time.Duration(binary.BigEndian.Uint32(ans[off+6:])) * time.Second
		if ttl == 0 {
			return
		}
		keep = min(keep, ttl)
		off += 12 + int(binary.BigEndian.Uint16(ans[off+10:]))
	}
	var kb [260]byte
	key := string(cacheKey(kb[:0], q))
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m = make(map[string]cachedAnswer)
	}
	if len(c.m) >= maxCached {
		for k, v := range c.m {
			if !now.Before(v.expires) {
				delete(c.m, k)
			}
		}
		if len(c.m) >= maxCached {
			clear(c.m)
		}
	}
	c.m[key] = cachedAnswer{ans: append([]byte(nil), ans...), expires: now.Add(keep)}
}

// answer appends to dst the reply to the plain query q from a kept answer
// and reports true, or reports false when there is none in time. The
// reply is the kept answer with the query's ID, RD and CD and its question
// as asked (case too), as the gateway would have written it.
func (c *answerCache) answer(dst []byte, q *Question, query []byte, now time.Time) ([]byte, bool) {
	if c == nil || (q.Type != 1 && q.Type != 28) {
		return dst, false
	}
	var kb [260]byte
	key := cacheKey(kb[:0], q)
	c.mu.Lock()
	e, ok := c.m[string(key)]
	c.mu.Unlock()
	if !ok || !now.Before(e.expires) {
		return dst, false
	}
	start := len(dst)
	dst = append(dst, e.ans...)
	out := dst[start:]
	out[0], out[1] = query[0], query[1]
	flags := binary.BigEndian.Uint16(out[2:4])&^(flagRD|flagCD) | q.Flags&(flagRD|flagCD)
	binary.BigEndian.PutUint16(out[2:4], flags)
	copy(out[headerLen:], query[headerLen:headerLen+len(q.Name)+4])
	return dst, true
}
