package egress

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/sluice-gw/sluice/gateway/scrub"
)

const wsTestSecret = "s3cr3t-token-value"

// frame builds one unmasked server frame.
func frame(fin bool, op byte, payload []byte) []byte {
	b0 := op
	if fin {
		b0 |= 0x80
	}
	var out []byte
	switch l := len(payload); {
	case l < 126:
		out = []byte{b0, byte(l)}
	case l <= 0xFFFF:
		out = []byte{b0, 126, 0, 0}
		binary.BigEndian.PutUint16(out[2:], uint16(l))
	default:
		out = make([]byte, 10)
		out[0], out[1] = b0, 127
		binary.BigEndian.PutUint64(out[2:], uint64(l))
	}
	return append(out, payload...)
}

type wsFrame struct {
	op      byte
	payload string
}

// readFrames parses what copyWSScrubbed wrote: every frame must be final
// and well formed.
func readFrames(t testing.TB, b []byte) []wsFrame {
	t.Helper()
	br := bufio.NewReader(bytes.NewReader(b))
	var out []wsFrame
	for {
		op, fin, p, err := readWSFrame(br, 1<<30)
		if err == io.EOF {
			return out
		}
		if err != nil || !fin {
			t.Fatalf("output frame %d: fin %v, %v", len(out), fin, err)
		}
		out = append(out, wsFrame{op, string(p)})
	}
}

func TestCopyWSScrubbed(t *testing.T) {
	scr := scrub.New([]byte(wsTestSecret))
	cat := func(bs ...[]byte) []byte { return bytes.Join(bs, nil) }
	cases := []struct {
		name      string
		in        []byte
		limit     int64
		want      []wsFrame
		reflected int
		err       string // substring of the error; "" for a clean end
	}{
		{"text message passes", frame(true, wsText, []byte("hello")), 1 << 20,
			[]wsFrame{{wsText, "hello"}}, 0, ""},
		{"secret in a message is replaced", frame(true, wsText, []byte("key="+wsTestSecret+"!")), 1 << 20,
			[]wsFrame{{wsText, "key=" + scrub.Replacement + "!"}}, 1, ""},
		{"secret split across fragments is found", cat(
			frame(false, wsBinary, []byte("a "+wsTestSecret[:6])),
			frame(true, wsPing, []byte("p")),
			frame(false, wsContinuation, []byte(wsTestSecret[6:12])),
			frame(true, wsContinuation, []byte(wsTestSecret[12:]+" z"))), 1 << 20,
			[]wsFrame{{wsPing, "p"}, {wsBinary, "a " + scrub.Replacement + " z"}}, 1, ""},
		{"16-bit length", frame(true, wsBinary, bytes.Repeat([]byte("x"), 300)), 1 << 20,
			[]wsFrame{{wsBinary, strings.Repeat("x", 300)}}, 0, ""},
		{"64-bit length", frame(true, wsBinary, bytes.Repeat([]byte("y"), 70000)), 1 << 20,
			[]wsFrame{{wsBinary, strings.Repeat("y", 70000)}}, 0, ""},
		{"close reason with the secret keeps only the code", frame(true, wsClose, append([]byte{0x03, 0xe8}, wsTestSecret...)), 1 << 20,
			[]wsFrame{{wsClose, "\x03\xe8"}}, 1, ""},
		{"ping with the secret loses its payload", frame(true, wsPing, []byte(wsTestSecret)), 1 << 20,
			[]wsFrame{{wsPing, ""}}, 1, ""},
		{"message over the limit", frame(true, wsText, bytes.Repeat([]byte("x"), 100)), 64,
			nil, 0, "over 64 bytes"},
		{"fragments over the limit together", cat(frame(false, wsText, bytes.Repeat([]byte("x"), 40)), frame(true, wsContinuation, bytes.Repeat([]byte("x"), 40))), 64,
			nil, 0, "over 24 bytes"},
		{"control frame near the limit is still fine", cat(frame(false, wsText, bytes.Repeat([]byte("x"), 60)), frame(true, wsPong, []byte("0123456789")), frame(true, wsContinuation, []byte("x"))), 64,
			[]wsFrame{{wsPong, "0123456789"}, {wsText, strings.Repeat("x", 61)}}, 0, ""},
		{"reserved bit (compression) set", []byte{0xC1, 0x01, 'x'}, 1 << 20, nil, 0, "reserved bits"},
		{"masked frame from the server", []byte{0x81, 0x81, 1, 2, 3, 4, 'x'}, 1 << 20, nil, 0, "masked frame"},
		{"unknown opcode", []byte{0x83, 0x00}, 1 << 20, nil, 0, "unknown opcode"},
		{"fragmented control frame", []byte{0x09, 0x00}, 1 << 20, nil, 0, "control frame"},
		{"control frame over 125", []byte{0x89, 126, 0, 126}, 1 << 20, nil, 0, "control frame"},
		{"continuation with no message", frame(true, wsContinuation, []byte("x")), 1 << 20, nil, 0, "continuation frame outside"},
		{"new message inside a fragmented one", cat(frame(false, wsText, []byte("a")), frame(true, wsText, []byte("b"))), 1 << 20, nil, 0, "new message inside"},
		{"64-bit length with the top bit", []byte{0x82, 127, 0x80, 0, 0, 0, 0, 0, 0, 1}, 1 << 20, nil, 0, "top bit"},
		{"ends inside a frame", []byte{0x81, 0x05, 'a', 'b'}, 1 << 20, nil, 0, "ended inside a frame"},
		{"ends inside a fragmented message", frame(false, wsText, []byte("a")), 1 << 20, nil, 0, "EOF"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			var n atomic.Int64
			hits := 0
			err := copyWSScrubbed(&out, bytes.NewReader(tc.in), scr, tc.limit, &n, func() {}, func() { hits++ })
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
			if tc.err != "" && tc.err != "EOF" && !errors.Is(err, errWSProtocol) {
				t.Fatalf("err %v does not wrap errWSProtocol", err)
			}
			if n.Load() != int64(out.Len()) {
				t.Fatalf("counted %d bytes, wrote %d", n.Load(), out.Len())
			}
			if tc.err != "" {
				return
			}
			got := readFrames(t, out.Bytes())
			if len(got) != len(tc.want) {
				t.Fatalf("frames %q, want %q", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Fatalf("frame %d = %q, want %q", i, got[i], tc.want[i])
				}
			}
			if hits != tc.reflected {
				t.Fatalf("reflected %d times, want %d", hits, tc.reflected)
			}
			if bytes.Contains(out.Bytes(), []byte(wsTestSecret)) {
				t.Fatal("the secret went through")
			}
		})
	}
}

func TestCheckWSHandshake(t *testing.T) {
	key := "dGhlIHNhbXBsZSBub25jZQ=="
	cases := []struct {
		name string
		mod  func(r *http.Request)
		err  string
	}{
		{"valid", func(*http.Request) {}, ""},
		{"HTTP/1.0", func(r *http.Request) { r.ProtoMajor, r.ProtoMinor = 1, 0 }, "HTTP/1.1"},
		{"a body", func(r *http.Request) { r.ContentLength = 3 }, "no body"},
		{"no key", func(r *http.Request) { r.Header.Del("Sec-WebSocket-Key") }, "exactly one"},
		{"key of 15 bytes", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Key", "AAAAAAAAAAAAAAAAAAAA") }, "16 bytes"},
		{"version 8", func(r *http.Request) { r.Header.Set("Sec-WebSocket-Version", "8") }, "version"},
		{"two versions", func(r *http.Request) { r.Header.Add("Sec-WebSocket-Version", "13") }, "version"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodGet, "https://api.test/ws", nil)
			r.Header.Set("Connection", "keep-alive, Upgrade")
			r.Header.Set("Upgrade", "websocket")
			r.Header.Set("Sec-WebSocket-Key", key)
			r.Header.Set("Sec-WebSocket-Version", "13")
			tc.mod(r)
			err := checkWSHandshake(r)
			if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
	// RFC 6455 1.3's example.
	if got := wsAccept(key); got != "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=" {
		t.Fatalf("wsAccept = %q", got)
	}
	if wsKey(&http.Request{Method: http.MethodPost, Header: http.Header{"Connection": {"Upgrade"}, "Upgrade": {"websocket"}, "Sec-Websocket-Key": {key}}}) != "" {
		t.Fatal("a POST is not an upgrade")
	}
	if wsKey(&http.Request{Method: http.MethodGet, Header: http.Header{"Upgrade": {"websocket"}, "Sec-Websocket-Key": {key}}}) != "" {
		t.Fatal("Upgrade without Connection: Upgrade is not an upgrade")
	}
}

// FuzzCopyWSScrubbed: whatever an upstream sends, the relay never panics,
// writes only well-formed final frames it counted, and never the secret.
func FuzzCopyWSScrubbed(f *testing.F) {
	f.Add(frame(true, wsText, []byte("hello")))                                                                // plain message
	f.Add(frame(true, wsText, []byte(wsTestSecret)))                                                           // the secret whole
	f.Add(append(frame(false, wsText, []byte(wsTestSecret[:5])), frame(true, 0, []byte(wsTestSecret[5:]))...)) // split
	f.Add(frame(true, wsClose, append([]byte{3, 232}, wsTestSecret...)))                                       // close reason
	f.Add([]byte{0x82, 127, 0, 0, 0, 0, 0, 1, 0, 0})                                                           // 64-bit length, truncated
	scr := scrub.New([]byte(wsTestSecret))
	f.Fuzz(func(t *testing.T, in []byte) {
		var out bytes.Buffer
		var n atomic.Int64
		_ = copyWSScrubbed(&out, bytes.NewReader(in), scr, 4096, &n, func() {}, func() {})
		if n.Load() != int64(out.Len()) {
			t.Fatalf("counted %d, wrote %d", n.Load(), out.Len())
		}
		for _, fr := range readFrames(t, out.Bytes()) {
			if strings.Contains(fr.payload, wsTestSecret) {
				t.Fatalf("the secret went through in %q", fr.payload)
			}
		}
	})
}
