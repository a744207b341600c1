package egress

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"

	"github.com/sluice-gw/sluice/policy"
)

// egressDecisions caches policy decisions of kinds http and connect
// (decision_cache.go). The key is the whole input document but its time:
// the caller, the kind and the SHA-256 of an injective encoding of
// policy.Request (method, host, port, path, every query parameter and every
// header the policy sees, maps in sorted order); two inputs sharing a key
// would be a SHA-256 collision. Hashing also keeps no header value (a
// cookie, the agent's own token) in the cache. Different callers never
// share an entry.
type egressDecisions = decisionCache[egressDecisionKey]

type egressDecisionKey struct {
	caller policy.Caller
	kind   string
	req    [sha256.Size]byte // requestKey
}

// requestKey hashes an injective encoding of every field of req the
// policy sees: each string is preceded by its length, each map by its size
// (nil apart from empty) and its keys come sorted.
func requestKey(req *policy.Request) [sha256.Size]byte {
	var stack [1024]byte
	b := stack[:0]
	str := func(s string) { b = binary.AppendUvarint(b, uint64(len(s))); b = append(b, s...) }
	str(req.Method)
	str(req.Host)
	b = binary.AppendUvarint(b, uint64(req.Port))
	str(req.Path)
	str(req.Body) // a forward-proxied body: another body is another decision (its findings)
	for _, m := range [2]map[string][]string{req.Query, req.Headers} {
		if m == nil {
			b = append(b, 0)
			continue
		}
		b = binary.AppendUvarint(b, uint64(len(m))+1)
		var kstack [16]string
		keys := kstack[:0]
		for k := range m {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			str(k)
			vs := m[k]
			b = binary.AppendUvarint(b, uint64(len(vs)))
			for _, v := range vs {
				str(v)
			}
		}
	}
	return sha256.Sum256(b)
}
