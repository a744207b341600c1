package egress

import (
	"bytes"
	"encoding/binary"
	"io"
	"net/http"
	"testing"

	mdns "github.com/miekg/dns"
	"github.com/sluice-gw/sluice/gateway/egress/egresstest"
)

// trickleReader returns its data a few bytes per Read, so the stream's
// frames arrive split across many HTTP chunks and reads.
type trickleReader struct {
	data []byte
	step int
}

func (r *trickleReader) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	r.step = r.step%7 + 1
	n := min(len(p), r.step, len(r.data))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// TestDNSStreamFrameSplits: the stream reads its frames in place from its
// reader's buffer (Peek); frames split across reads, frames of the largest
// allowed size and frames that cross the end of that buffer (many frames
// totalling more than dnsStreamReadBuf) are each answered, exactly once.
func TestDNSStreamFrameSplits(t *testing.T) {
	up := egresstest.NewDNSUpstream(t, map[string]string{})
	g := startEgressGateway(t, up, nil)
	c := g.client(agentA)
	// garbage is a message that parses as no question: answered FORMERR
	// on a worker, with its ID.
	garbage := func(id uint16, size int) []byte {
		b := binary.BigEndian.AppendUint16(nil, id)
		return append(b, bytes.Repeat([]byte{0xff}, size-2)...)
	}
	frames := func(sizes ...int) []byte {
		var body []byte
		for i, n := range sizes {
			body = binary.BigEndian.AppendUint16(body, uint16(n))
			body = append(body, garbage(uint16(i+1), n)...)
		}
		return body
	}
	many := make([]int, 0, 64)
	for i := range cap(many) {
		many = append(many, 3+(i*97)%maxDNSMessage) // > dnsStreamReadBuf in all
	}
	tests := []struct {
		name    string
		body    []byte
		trickle bool
		want    int // FORMERR answers
	}{
		{"largest frame", frames(maxDNSMessage), false, 1},
		{"largest frame trickled", frames(maxDNSMessage, 3, maxDNSMessage), true, 3},
		{"frames across the read buffer", frames(many...), false, len(many)},
		{"frames across the read buffer trickled", frames(many...), true, len(many)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = bytes.NewReader(tc.body)
			if tc.trickle {
				body = &trickleReader{data: tc.body}
			}
			req, _ := http.NewRequest(http.MethodPost, "http://sluice/v1/dns", io.NopCloser(body))
			req.Header.Set("Content-Type", DNSStreamType)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			out, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			ids := map[uint16]bool{}
			for len(out) >= 2 {
				n := int(binary.BigEndian.Uint16(out))
				m := new(mdns.Msg)
				if err := m.Unpack(out[2 : 2+n]); err != nil {
					t.Fatalf("answer does not parse: %v", err)
				}
				if m.Rcode != mdns.RcodeFormatError {
					t.Errorf("answer %d: %s, want FORMERR", m.Id, mdns.RcodeToString[m.Rcode])
				}
				if ids[m.Id] {
					t.Errorf("answer %d twice", m.Id)
				}
				ids[m.Id] = true
				out = out[2+n:]
			}
			if len(ids) != tc.want {
				t.Fatalf("%d answers, want %d", len(ids), tc.want)
			}
		})
	}
}
