package dns

import (
	"encoding/binary"
	"net/netip"
)

// The fast path: the stub and the gateway handle the common question — a
// plain query for one ordinary name — and its answer without unpacking and
// repacking them with miekg/dns. ParseQuery accepts only a strict subset of
// what miekg accepts (its fuzz target checks that miekg parses whatever it
// accepts to the same question, and repacks it to the same bytes); anything
// else takes the full parse, as before.

// Header flag bits (RFC 1035 4.1.1, RFC 4035 3.2).
const (
	flagQR = 0x8000
	flagRD = 0x0100
	flagRA = 0x0080
	flagCD = 0x0010
)

// maxWireName is the longest name in wire format (RFC 1035 2.3.4).
const maxWireName = 255

// Question is the one question of a query that ParseQuery accepted. Name
// is the question's name in wire format, as asked (case kept), a slice of
// the parsed message.
type Question struct {
	ID    uint16
	Flags uint16 // the header's second word
	Name  []byte // wire format: length-prefixed labels and the root's zero
	Type  uint16
	Class uint16
}

// RD reports whether the query asked for recursion.
func (q *Question) RD() bool { return q.Flags&flagRD != 0 }

// ParseQuery parses msg if it is a plain query: QR clear, opcode QUERY,
// exactly one question and no other records (no EDNS), nothing after the
// question, and a name of at most 255 octets that is not the root and has
// no compression pointer, made of labels of 1 to 63 letters, digits, '-' and
// '_'. It reports false for anything else — which is not necessarily
// malformed; the caller then parses it fully.
func ParseQuery(msg []byte) (Question, bool) {
	if len(msg) < headerLen+1+4 {
		return Question{}, false
	}
	flags := binary.BigEndian.Uint16(msg[2:4])
	if flags&flagQR != 0 || flags&0x7800 != 0 { // a response, or an opcode other than QUERY
		return Question{}, false
	}
	if binary.BigEndian.Uint16(msg[4:6]) != 1 || binary.BigEndian.Uint64(msg[4:12])&0xffffffffffff != 0 {
		return Question{}, false
	}
	end, ok := nameEnd(msg, headerLen)
	if !ok || end+4 != len(msg) {
		return Question{}, false
	}
	return Question{
		ID:    binary.BigEndian.Uint16(msg[0:2]),
		Flags: flags,
		Name:  msg[headerLen:end],
		Type:  binary.BigEndian.Uint16(msg[end : end+2]),
		Class: binary.BigEndian.Uint16(msg[end+2 : end+4]),
	}, true
}

// nameEnd checks the name at msg[off:] with the rules of ParseQuery and
// returns the offset just past it.
func nameEnd(msg []byte, off int) (int, bool) {
	start := off
	for {
		if off >= len(msg) {
			return 0, false
		}
		l := int(msg[off])
		if l == 0 {
			if off == start { // the root name
				return 0, false
			}
			off++
			return off, off-start <= maxWireName
		}
		if l > 63 || off+1+l > len(msg) || off+1+l-start >= maxWireName {
			return 0, false // a pointer or a reserved label type, or too long
		}
		for _, b := range msg[off+1 : off+1+l] {
			if !nameByte(b) {
				return 0, false
			}
		}
		off += 1 + l
	}
}

func nameByte(b byte) bool {
	return 'a' <= b && b <= 'z' || 'A' <= b && b <= 'Z' || '0' <= b && b <= '9' || b == '-' || b == '_'
}

// AppendName appends the presentation form of the wire name of a Question
// to dst: lower case, labels joined by dots, no trailing dot.
func AppendName(dst, wire []byte) []byte {
	for i := 0; i < len(wire) && wire[i] != 0; {
		l := int(wire[i])
		if i > 0 {
			dst = append(dst, '.')
		}
		for _, b := range wire[i+1 : i+1+l] {
			if 'A' <= b && b <= 'Z' {
				b += 'a' - 'A'
			}
			dst = append(dst, b)
		}
		i += 1 + l
	}
	return dst
}

// AppendAnswer appends the answer to q with rcode and, for an A or AAAA
// question, one record per address of the question's type with ttl: the
// ID, RD and CD of the query, QR and RA set, the question as asked (its
// case too), and each record's owner a compression pointer to the
// question's name. Addresses of the other family are skipped.
func AppendAnswer(dst []byte, q *Question, rcode int, addrs []netip.Addr, ttl uint32) []byte {
	const typeA, typeAAAA = 1, 28
	n := 0
	for _, a := range addrs {
		if (q.Type == typeA && a.Is4()) || (q.Type == typeAAAA && a.Is6() && !a.Is4In6()) {
			n++
		}
	}
	dst = binary.BigEndian.AppendUint16(dst, q.ID)
	dst = binary.BigEndian.AppendUint16(dst, flagQR|flagRA|q.Flags&(flagRD|flagCD)|uint16(rcode&0xf))
	dst = append(dst, 0, 1, byte(n>>8), byte(n), 0, 0, 0, 0)
	dst = append(dst, q.Name...)
	dst = binary.BigEndian.AppendUint16(dst, q.Type)
	dst = binary.BigEndian.AppendUint16(dst, q.Class)
	for _, a := range addrs {
		switch {
		case q.Type == typeA && a.Is4():
			b := a.As4()
			dst = append(dst, 0xc0, headerLen, 0, typeA, 0, 1)
			dst = binary.BigEndian.AppendUint32(dst, ttl)
			dst = append(dst, 0, 4)
			dst = append(dst, b[:]...)
		case q.Type == typeAAAA && a.Is6() && !a.Is4In6():
			b := a.As16()
			dst = append(dst, 0xc0, headerLen, 0, typeAAAA, 0, 1)
			dst = binary.BigEndian.AppendUint32(dst, ttl)
			dst = append(dst, 0, 16)
			dst = append(dst, b[:]...)
		}
	}
	return dst
}

// plainAnswer reports whether ans is an answer to the plain query whose
// question section (name, type and class as sent) is qsec, in the one shape
// AppendAnswer writes: QR set, opcode QUERY, the same question (names
// compared case-insensitively), no authority or additional records, and
// only records of the question's type A or AAAA, class IN, owned by a
// pointer to the question's name, with data of the address's size. The
// stub passes such an answer on as it is; any other answer is unpacked
// and checked in full.
func plainAnswer(ans, qsec []byte) bool {
	if len(ans) < headerLen+len(qsec) {
		return false
	}
	flags := binary.BigEndian.Uint16(ans[2:4])
	if flags&flagQR == 0 || flags&0x7800 != 0 || binary.BigEndian.Uint16(ans[4:6]) != 1 ||
		binary.BigEndian.Uint32(ans[8:12]) != 0 {
		return false
	}
	n := len(qsec) - 4
	if n < 1 || !equalFoldASCII(ans[headerLen:headerLen+n], qsec[:n]) ||
		string(ans[headerLen+n:headerLen+n+4]) != string(qsec[n:]) {
		return false
	}
	off := headerLen + len(qsec)
	an := int(binary.BigEndian.Uint16(ans[6:8]))
	qtype := binary.BigEndian.Uint16(qsec[len(qsec)-4:])
	var size int
	switch qtype {
	case 1:
		size = 4
	case 28:
		size = 16
	default:
		return an == 0 && off == len(ans)
	}
	if binary.BigEndian.Uint16(qsec[len(qsec)-2:]) != 1 && an != 0 {
		return false
	}
	for range an {
		if len(ans)-off < 12+size || ans[off] != 0xc0 || ans[off+1] != headerLen ||
			binary.BigEndian.Uint16(ans[off+2:]) != qtype || binary.BigEndian.Uint16(ans[off+4:]) != 1 ||
			int(binary.BigEndian.Uint16(ans[off+10:])) != size {
			return false
		}
		off += 12 + size
	}
	return off == len(ans)
}

// equalFoldASCII compares a and b with ASCII letters folded (RFC 4343).
func equalFoldASCII(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if 'A' <= x && x <= 'Z' {
			x += 'a' - 'A'
		}
		if 'A' <= y && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}
