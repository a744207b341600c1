package scrub

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"compress/zlib"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"
)

// MaxCodings is the most content codings Reply undoes on one reply; no
// server applies more than one, so more is an upstream playing games.
const MaxCodings = 2

// ReplyError says why a reply cannot be relayed to a caller whose request
// carried a secret. Reason is a stable code; the text names nothing the
// upstream chose except a coding or media type from a fixed list, so it may
// be shown to the caller (the upstream could have put the secret in any
// other header).
type ReplyError struct {
	Reason string // encoded_reply, opaque_reply, partial_reply, reply_too_large
	msg    string
}

func (e *ReplyError) Error() string { return e.msg }

// ReplyReason is the stable reason of a reply Reply refused: the
// ReplyError's Reason, or unreadable_reply for any other error.
func ReplyReason(err error) string {
	var re *ReplyError
	if errors.As(err, &re) {
		return re.Reason
	}
	return "unreadable_reply"
}

func refuse(reason, format string, args ...any) *ReplyError {
	return &ReplyError{Reason: reason, msg: fmt.Sprintf(format, args...)}
}

// Reply makes an upstream reply to a request that carried a secret fit to
// relay, or refuses it. The gateway's tool calls and its intercepted
// requests both pass through here, so that the two cannot disagree on what
// is seen through. In order:
//
//   - Content-Encoding: every field line and every comma-separated coding
//     counts (RFC 9110 8.4). identity and empty ones are no-ops; gzip,
//     x-gzip and deflate are undone, last applied first, to at most limit
//     bytes each; any other coding (br, zstd, compress, an unknown name) or
//     more than MaxCodings is refused. The field is then dropped.
//   - A body that is still compressed (gzip, zlib, zstd, bzip2, xz, 7z,
//     zip, rar or lz4 magic), or whose media type says it is, is opaque to
//     the scrubber and refused.
//   - A partial reply (Content-Range, multipart/byteranges) is refused: a
//     range of the body could hold part of a secret too short to match.
//   - Header names and values and the body are scrubbed.
//   - Content-Length is set to the length sent, never the upstream's (it
//     would tell the secret's length); digests of the original body go.
//
// Reply changes h in place and returns the body to send and whether a
// secret was found; an error is a *ReplyError.
func (s *Scrubber) Reply(h http.Header, body []byte, limit int64) ([]byte, bool, error) {
	codings, err := contentCodings(h)
	if err != nil {
		return nil, false, err
	}
	for i := len(codings) - 1; i >= 0; i-- {
		if body, err = decodeBody(codings[i], body, limit); err != nil {
			return nil, false, err
		}
	}
	h.Del("Content-Encoding")
	if len(h.Values("Content-Range")) > 0 {
		return nil, false, refuse("partial_reply", "the upstream sent part of a reply (Content-Range); a range cannot be checked for the secret")
	}
	if err := opaque(h.Values("Content-Type"), body); err != nil {
		return nil, false, err
	}
	hf := s.Header(h)
	out, bf := s.Bytes(body)
	if bf || len(codings) > 0 {
		for _, k := range []string{"Content-Md5", "Digest", "Content-Digest", "Repr-Digest"} {
			h.Del(k)
		}
	}
	h.Set("Content-Length", strconv.Itoa(len(out)))
	return out, hf || bf, nil
}

// contentCodings lists the codings of every Content-Encoding line in the
// order they were applied, without identity and empty members.
func contentCodings(h http.Header) ([]string, error) {
	var out []string
	for _, line := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(line, ",") {
			c = strings.ToLower(strings.TrimSpace(c))
			if c == "" || c == "identity" {
				continue
			}
			switch c {
			case "gzip", "x-gzip", "deflate":
			default:
				return nil, refuse("encoded_reply", "the upstream reply is encoded (%s) and cannot be checked for the secret", codingName(c))
			}
			out = append(out, c)
		}
	}
	if len(out) > MaxCodings {
		return nil, refuse("encoded_reply", "the upstream reply is encoded %d times; at most %d codings are undone", len(out), MaxCodings)
	}
	return out, nil
}

// codingName names c if it is a registered coding, so that an upstream
// cannot put text of its choice into the caller's error.
func codingName(c string) string {
	switch c {
	case "br", "zstd", "compress", "x-compress", "dcb", "dcz", "aes128gcm", "exi", "pack200-gzip":
		return c
	}
	return "an unregistered coding"
}

// decodeBody undoes one coding, reading at most limit bytes of output.
func decodeBody(coding string, body []byte, limit int64) ([]byte, error) {
	var r io.ReadCloser
	var err error
	switch coding {
	case "gzip", "x-gzip":
		r, err = gzip.NewReader(bytes.NewReader(body))
	case "deflate":
		// RFC 9110 8.4.1.2: the zlib format. Some servers send raw
		// DEFLATE; a body that is neither is refused below.
		if r, err = zlib.NewReader(bytes.NewReader(body)); err != nil {
			r, err = flate.NewReader(bytes.NewReader(body)), nil
		}
	default:
		return nil, refuse("encoded_reply", "bug(): coding %s reached decodeBody", coding)
	}
	if err != nil {
		return nil, refuse("encoded_reply", "the upstream reply claims %s coding but is not %s", coding, coding)
	}
	defer r.Close()
	out, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, refuse("encoded_reply", "the upstream reply's %s coding is broken", coding)
	}
	if int64(len(out)) > limit {
		return nil, refuse("reply_too_large", "the upstream reply decodes to more than %d bytes", limit)
	}
	return out, nil
}

// magics are the starts of compressed and archive formats (the files
// each format's specification or libmagic name).
var magics = []struct {
	name  string
	magic []byte
}{
	{"gzip", []byte{0x1f, 0x8b}},                             // RFC 1952 2.3.1
	{"zstd", []byte{0x28, 0xb5, 0x2f, 0xfd}},                 // RFC 8878 3.1.1
	{"zstd skippable frame", []byte{0x50, 0x2a, 0x4d, 0x18}}, // RFC 8878 3.1.2 (first of 16)
	{"bzip2", []byte("BZh")},
	{"xz", []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}},
	{"7z", []byte{'7', 'z', 0xbc, 0xaf, 0x27, 0x1c}},
	{"zip", []byte("PK\x03\x04")},
	{"zip", []byte("PK\x05\x06")}, // empty archive
	{"zip", []byte("PK\x07\x08")}, // spanned archive
	{"rar", []byte("Rar!\x1a\x07")},
	{"lz4", []byte{0x04, 0x22, 0x4d, 0x18}},
	{"lzip", []byte("LZIP")},
	{"compress", []byte{0x1f, 0x9d}},
}

// opaqueTypes are media types of compressed data (IANA registry and the
// x- names servers still send). A "+gzip", "+zip" or "+zstd" suffix
// (RFC 6839 style) counts too.
var opaqueTypes = map[string]bool{
	"application/gzip": true, "application/x-gzip": true, "application/zip": true, "application/x-zip-compressed": true,
	"application/zstd": true, "application/x-zstd": true, "application/x-bzip2": true, "application/x-bzip": true,
	"application/x-xz": true, "application/x-7z-compressed": true, "application/x-rar-compressed": true,
	"application/vnd.rar": true, "application/x-compress": true, "application/x-lz4": true, "application/x-lzip": true,
	"application/x-brotli": true, "application/br": true, "application/java-archive": true, "application/epub+zip": true,
	"multipart/byteranges": true,
}

// opaque refuses a body the scrubber cannot read: compressed data by its
// first bytes, whatever the reply calls it, or by its media type.
func opaque(types []string, body []byte) error {
	for _, m := range magics {
		if bytes.HasPrefix(body, m.magic) {
			return refuse("opaque_reply", "the upstream reply is %s data and cannot be checked for the secret", m.name)
		}
	}
	if isZlib(body) {
		return refuse("opaque_reply", "the upstream reply is zlib data and cannot be checked for the secret")
	}
	for _, ct := range types {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil {
			mt, _, _ = strings.Cut(strings.ToLower(ct), ";")
			mt = strings.TrimSpace(mt)
		}
		if opaqueTypes[mt] || strings.HasSuffix(mt, "+gzip") || strings.HasSuffix(mt, "+zip") || strings.HasSuffix(mt, "+zstd") {
			if mt == "multipart/byteranges" {
				return refuse("partial_reply", "the upstream sent parts of a reply (multipart/byteranges); ranges cannot be checked for the secret")
			}
			return refuse("opaque_reply", "the upstream reply is compressed or archived data and cannot be checked for the secret")
		}
	}
	return nil
}

// isZlib reports a zlib header (RFC 1950 2.2): CM 8, a window of at most
// 32 KiB, FCHECK making the pair a multiple of 31, and a second byte that
// is not printable text, so that prose starting "x^" or "xD" is not taken
// for it.
func isZlib(b []byte) bool {
	if len(b) < 2 || b[0]&0x0f != 8 || b[0]>>4 > 7 || (uint16(b[0])<<8|uint16(b[1]))%31 != 0 {
		return false
	}
	return b[1] < 0x20 || b[1] >= 0x7f
}
