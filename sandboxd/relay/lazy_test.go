package relay

import (
	"net"
	"testing"
	"time"
)

// The DNS stub's UDP server starts with the first datagram: waitReadable
// returns once one is there (leaving it to be read), and false once the
// socket is closed instead.
func TestWaitReadable(t *testing.T) {
	cases := []struct {
		name string
		act  func(pc net.PacketConn) error
		want bool
	}{
		{"a datagram arrives", func(pc net.PacketConn) error {
			c, err := net.Dial("udp", pc.LocalAddr().String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte("q"))
			return err
		}, true},
		{"closed", func(pc net.PacketConn) error { return pc.Close() }, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pc, err := net.ListenPacket("udp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer pc.Close()
			got := make(chan bool, 1)
			go func() { got <- waitReadable(pc) }()
			select {
			case <-got:
				t.Fatal("returned before anything happened")
			case <-time.After(50 * time.Millisecond):
			}
			if err := tc.act(pc); err != nil {
				t.Fatal(err)
			}
			select {
			case g := <-got:
				if g != tc.want {
					t.Fatalf("waitReadable = %v, want %v", g, tc.want)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("waitReadable did not return")
			}
			if tc.want {
				// Nothing was read: the datagram is still there.
				_ = pc.SetReadDeadline(time.Now().Add(time.Second))
				b := make([]byte, 8)
				if n, _, err := pc.ReadFrom(b); err != nil || string(b[:n]) != "q" {
					t.Fatalf("read after wait: %q, %v; want the datagram", b[:n], err)
				}
			}
		})
	}
}
