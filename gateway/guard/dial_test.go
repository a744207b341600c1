package guard

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tableResolver answers from a fixed table and counts lookups. It stands
// in for DNS, which is out of scope for this package (see TestRealResolver
// for the real net.Resolver path).
type tableResolver struct {
	answers map[string][][]netip.Addr // successive answers per name; the last repeats
	mu      sync.Mutex
	calls   map[string]int
}

func (r *tableResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.calls == nil {
		r.calls = map[string]int{}
	}
	seq, ok := r.answers[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	i := min(r.calls[host], len(seq)-1)
	r.calls[host]++
	var out []netip.Addr
	for _, a := range seq[i] {
		if network == "ip4" && !a.Unmap().Is4() || network == "ip6" && a.Unmap().Is4() {
			continue
		}
		out = append(out, a)
	}
	return out, nil
}

func addrs(s ...string) []netip.Addr {
	out := make([]netip.Addr, len(s))
	for i, v := range s {
		out[i] = netip.MustParseAddr(v)
	}
	return out
}

// countingListener is a real loopback TCP listener that counts accepted
// connections: the control that proves a refusal sent nothing.
type countingListener struct {
	ln      net.Listener
	accepts atomic.Int32
	got     chan struct{}
}

func listen(t *testing.T) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	cl := &countingListener{ln: ln, got: make(chan struct{}, 16)}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			cl.accepts.Add(1)
			c.Close()
			cl.got <- struct{}{}
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return cl
}

func (cl *countingListener) port() uint16 { return uint16(cl.ln.Addr().(*net.TCPAddr).Port) }

// noDial returns Options hooks that fail the test if any dial is attempted.
func noDial(t *testing.T) (func(string, netip.AddrPort), func(context.Context, string, string) (net.Conn, error)) {
	return func(host string, ap netip.AddrPort) {
			t.Errorf("OnDial(%q, %s) called for a refused destination", host, ap)
		}, func(_ context.Context, _, addr string) (net.Conn, error) {
			t.Errorf("DialFunc(%s) called for a refused destination", addr)
			return nil, errors.New("test: must not dial")
		}
}

// TestThreatsDenied is THREATS.md C1, C2 and C3: each destination is refused
// with *DeniedError of the expected class and nothing is dialled.
func TestThreatsDenied(t *testing.T) {
	everything := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	res := &tableResolver{answers: map[string][][]netip.Addr{
		"127.0.0.1.nip.io":  {addrs("127.0.0.1")},
		"internal.test":     {addrs("10.0.0.1")},
		"home.test":         {addrs("192.168.1.1")},
		"ula.test":          {addrs("fc00::1")},
		"imds.test":         {addrs("169.254.169.254")},
		"mixed.test":        {addrs("93.184.215.14", "127.0.0.1")},
		"mixed-v6.test":     {addrs("2606:4700::1111", "::ffff:169.254.169.254")},
		"nat64-imds.test":   {addrs("64:ff9b::a9fe:a9fe")},
		"unspecified.test":  {addrs("0.0.0.0")},
		"localhost-ish.com": {addrs("127.0.0.2")},
	}}
	tests := []struct {
		name     string
		addr     string
		allow    []netip.Prefix
		want     Class
		wantAddr string // "" means the name itself was refused
	}{
		// C1: metadata, even if allow-listed.
		{"C1 imds", "169.254.169.254:80", nil, Metadata, "169.254.169.254"},
		{"C1 imds allow-listed", "169.254.169.254:80", everything, Metadata, "169.254.169.254"},
		{"C1 imds v6", "[fd00:ec2::254]:80", nil, Metadata, "fd00:ec2::254"},
		{"C1 imds v6 allow-listed", "[fd00:ec2::254]:80", everything, Metadata, "fd00:ec2::254"},
		{"C1 gcp name", "metadata.google.internal:80", nil, Metadata, ""},
		{"C1 gcp name allow-listed", "METADATA.google.internal.:80", everything, Metadata, ""},
		{"C1 ecs", "169.254.170.2:80", everything, Metadata, "169.254.170.2"},
		// C2: spellings.
		{"C2 decimal dword", "2130706433:80", nil, Loopback, "127.0.0.1"},
		{"C2 hex dword", "0x7f000001:80", nil, Loopback, "127.0.0.1"},
		{"C2 octal", "0177.0.0.1:80", nil, Loopback, "127.0.0.1"},
		{"C2 short", "127.1:80", nil, Loopback, "127.0.0.1"},
		{"C2 zero", "0:80", nil, Unspecified, "0.0.0.0"},
		{"C2 zero allow-listed", "0:80", everything, Unspecified, "0.0.0.0"},
		{"C2 0.0.0.0", "0.0.0.0:80", nil, Unspecified, "0.0.0.0"},
		{"C2 [::]", "[::]:80", everything, Unspecified, "::"},
		{"C2 mapped imds", "[::ffff:169.254.169.254]:80", everything, Metadata, "::ffff:169.254.169.254"},
		{"C2 nat64 imds RFC6052", "[64:ff9b::a9fe:a9fe]:80", everything, Metadata, "64:ff9b::a9fe:a9fe"},
		{"C2 6to4 imds RFC3056", "[2002:a9fe:a9fe::1]:80", everything, Metadata, "2002:a9fe:a9fe::1"},
		{"C2 cgnat RFC6598", "100.64.0.1:80", nil, CGNAT, "100.64.0.1"},
		{"C2 mapped loopback", "[::ffff:127.0.0.1]:80", nil, Loopback, "::ffff:127.0.0.1"},
		{"C2 compatible loopback", "[::127.0.0.1]:80", nil, Loopback, "::7f00:1"},
		{"C2 teredo loopback RFC4380", "[2001:0:4136:e378:8000:63bf:80ff:fffe]:80", nil, Loopback, "2001:0:4136:e378:8000:63bf:80ff:fffe"},
		{"C2 rfc1918 10", "10.0.0.1:80", nil, Private, "10.0.0.1"},
		{"C2 rfc1918 192.168", "192.168.1.1:80", nil, Private, "192.168.1.1"},
		{"C2 ula RFC4193", "[fc00::1]:80", nil, Private, "fc00::1"},
		{"C2 multicast", "[ff02::1]:80", everything, Multicast, "ff02::1"},
		{"C2 loopback v6", "[::1]:80", nil, Loopback, "::1"},
		{"C2 localhost name RFC6761", "localhost:80", everything, Loopback, ""},
		{"C2 sub.localhost RFC6761", "app.localhost:80", nil, Loopback, ""},
		// C3: names resolving to internal addresses.
		{"C3 nip.io", "127.0.0.1.nip.io:80", nil, Loopback, "127.0.0.1"},
		{"C3 rfc1918", "internal.test:443", nil, Private, "10.0.0.1"},
		{"C3 rfc1918 192.168", "home.test:443", nil, Private, "192.168.1.1"},
		{"C3 ula", "ula.test:443", nil, Private, "fc00::1"},
		{"C3 imds by name", "imds.test:80", everything, Metadata, "169.254.169.254"},
		{"C3 mixed answers", "mixed.test:443", nil, Loopback, "127.0.0.1"},
		{"C3 mixed answers v6", "mixed-v6.test:443", nil, Metadata, "::ffff:169.254.169.254"},
		{"C3 nat64 by name", "nat64-imds.test:80", everything, Metadata, "64:ff9b::a9fe:a9fe"},
		{"C3 unspecified by name", "unspecified.test:80", everything, Unspecified, "0.0.0.0"},
		{"C3 loopback by name", "localhost-ish.com:80", nil, Loopback, "127.0.0.2"},
		{"C3 allow for other range", "internal.test:443", []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}, Private, "10.0.0.1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			onDial, dialFunc := noDial(t)
			d := New(Options{Resolver: res, OnDial: onDial, DialFunc: dialFunc})
			conn, err := d.DialContext(t.Context(), "tcp", tt.addr, tt.allow)
			if conn != nil {
				conn.Close()
				t.Fatal("got a connection")
			}
			var de *DeniedError
			if !errors.As(err, &de) {
				t.Fatalf("DialContext(%s) error = %v, want *DeniedError", tt.addr, err)
			}
			if de.Class != tt.want {
				t.Errorf("class = %s, want %s", de.Class, tt.want)
			}
			gotAddr := ""
			if de.Addr.IsValid() {
				gotAddr = de.Addr.String()
			}
			if gotAddr != tt.wantAddr {
				t.Errorf("refused address = %q, want %q", gotAddr, tt.wantAddr)
			}
			if de.Host == "" || !strings.Contains(err.Error(), "egress denied") {
				t.Errorf("error %q lacks host or reason", err)
			}
		})
	}
}

// TestLoopbackControl pairs a refusal with a control run against a real
// listener: the refusal sends nothing, and the same dial with allow succeeds,
// so the refusal is provably the guard's.
func TestLoopbackControl(t *testing.T) {
	cl := listen(t)
	target := fmt.Sprintf("127.0.0.1:%d", cl.port())
	var dialled []netip.AddrPort
	d := New(Options{OnDial: func(_ string, ap netip.AddrPort) { dialled = append(dialled, ap) }})

	t.Run("refused", func(t *testing.T) {
		conn, err := d.DialContext(t.Context(), "tcp", target, nil)
		var de *DeniedError
		if !errors.As(err, &de) || de.Class != Loopback {
			if conn != nil {
				conn.Close()
			}
			t.Fatalf("DialContext = %v, want DeniedError loopback", err)
		}
		// Give a stray connection time to be accepted before counting.
		time.Sleep(50 * time.Millisecond)
		if n := cl.accepts.Load(); n != 0 {
			t.Fatalf("listener accepted %d connections after a refusal", n)
		}
		if len(dialled) != 0 {
			t.Fatalf("OnDial saw %v", dialled)
		}
	})
	t.Run("refused by name", func(t *testing.T) {
		_, err := d.DialContext(t.Context(), "tcp", fmt.Sprintf("localhost:%d", cl.port()), nil)
		var de *DeniedError
		if !errors.As(err, &de) || de.Class != Loopback || de.Addr.IsValid() {
			t.Fatalf("DialContext(localhost) = %v, want name refused as loopback", err)
		}
		if n := cl.accepts.Load(); n != 0 {
			t.Fatalf("listener accepted %d connections", n)
		}
	})
	t.Run("allowed", func(t *testing.T) {
		conn, err := d.DialContext(t.Context(), "tcp", target, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
		if err != nil {
			t.Fatalf("DialContext with allow: %v", err)
		}
		defer conn.Close()
		select {
		case <-cl.got:
		case <-time.After(5 * time.Second):
			t.Fatal("listener never accepted")
		}
		if n := cl.accepts.Load(); n != 1 {
			t.Fatalf("accepts = %d, want 1", n)
		}
		want := netip.MustParseAddrPort(target)
		if len(dialled) != 1 || dialled[0] != want {
			t.Fatalf("OnDial saw %v, want [%s]", dialled, want)
		}
		if got := conn.RemoteAddr().String(); got != target {
			t.Fatalf("connected to %s, want %s", got, target)
		}
	})
}

// TestDialsClassifiedAddress is THREATS C4: the resolver is asked once and
// the connect goes to exactly the address that was classified, even if the
// name would now resolve elsewhere (rebinding with TTL 0).
func TestDialsClassifiedAddress(t *testing.T) {
	res := &tableResolver{answers: map[string][][]netip.Addr{
		"rebind.test": {addrs("93.184.215.14"), addrs("127.0.0.1")},
		"multi.test":  {addrs("93.184.215.14", "2606:2800:21f:cb07:6820:80da:af6b:8b2c")},
		"mapped.test": {addrs("::ffff:93.184.215.14")},
	}}
	tests := []struct {
		name    string
		network string
		addr    string
		want    []string // addresses handed to DialFunc, in order
	}{
		{"rebind first answer", "tcp", "rebind.test:443", []string{"93.184.215.14:443"}},
		{"rebind second call would differ", "tcp", "rebind.test:443", []string{"127.0.0.1:443"}}, // see below
		{"tries in order", "tcp", "multi.test:443", []string{"93.184.215.14:443", "[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443"}},
		{"tcp4 only v4", "tcp4", "multi.test:443", []string{"93.184.215.14:443"}},
		{"mapped is unmapped", "tcp", "mapped.test:80", []string{"93.184.215.14:80"}},
		{"literal needs no lookup", "tcp", "93.184.215.14:443", []string{"93.184.215.14:443"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			d := New(Options{Resolver: res, DialFunc: func(_ context.Context, _, addr string) (net.Conn, error) {
				got = append(got, addr)
				return nil, errors.New("test: refused by test dialer")
			}})
			before := res.callCount()
			_, err := d.DialContext(t.Context(), tt.network, tt.addr, nil)
			if tt.name == "rebind second call would differ" {
				// The second lookup of rebind.test answers 127.0.0.1:
				// it is classified and refused, never dialled.
				var de *DeniedError
				if !errors.As(err, &de) || de.Class != Loopback || len(got) != 0 {
					t.Fatalf("rebound answer: err %v, dialled %v; want loopback refusal and no dial", err, got)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), "refused by test dialer") {
				t.Fatalf("err = %v, want the test dialer's error", err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("dialled %v, want %v", got, tt.want)
			}
			lookups := res.callCount() - before
			if strings.HasPrefix(tt.addr, "93.") {
				if lookups != 0 {
					t.Fatalf("IP literal caused %d lookups", lookups)
				}
			} else if lookups != 1 {
				t.Fatalf("lookups = %d, want exactly 1", lookups)
			}
		})
	}
}

func (r *tableResolver) callCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, c := range r.calls {
		n += c
	}
	return n
}

func TestSelf(t *testing.T) {
	self := []netip.Prefix{netip.MustParsePrefix("93.184.215.14/32"), netip.MustParsePrefix("10.1.2.3/32")}
	tests := []struct {
		name  string
		addr  string
		allow []netip.Prefix
		want  Class // Public means the dial must go through
	}{
		{"own public address", "93.184.215.14:443", nil, Self},
		{"own private address", "10.1.2.3:443", nil, Self},
		{"own address mapped", "[::ffff:93.184.215.14]:443", nil, Self},
		{"own address via 6to4", "[2002:5db8:d70e::1]:443", nil, Self},
		{"own address allow-listed", "10.1.2.3:443", []netip.Prefix{netip.MustParsePrefix("10.1.2.3/32")}, Public},
		{"other public", "93.184.215.15:443", nil, Public},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dialled := false
			d := New(Options{Self: self, DialFunc: func(context.Context, string, string) (net.Conn, error) {
				dialled = true
				return nil, errors.New("test: not dialling")
			}})
			_, err := d.DialContext(t.Context(), "tcp", tt.addr, tt.allow)
			var de *DeniedError
			if tt.want == Public {
				if !dialled || errors.As(err, &de) {
					t.Fatalf("err = %v, dialled = %v; want a dial", err, dialled)
				}
				return
			}
			if !errors.As(err, &de) || de.Class != tt.want || dialled {
				t.Fatalf("err = %v, dialled = %v; want DeniedError %s and no dial", err, dialled, tt.want)
			}
		})
	}
}

func TestDialErrors(t *testing.T) {
	res := &tableResolver{answers: map[string][][]netip.Addr{"empty.test": {nil}, "v6only.test": {addrs("2606:4700::1111")}}}
	onDial, dialFunc := noDial(t)
	d := New(Options{Resolver: res, OnDial: onDial, DialFunc: dialFunc})
	tests := []struct {
		name    string
		network string
		addr    string
		want    string
	}{
		{"bad authority", "tcp", "user@example.com:80", "userinfo"},
		{"no port", "tcp", "example.com", "missing port"},
		{"bad network", "unix", "example.com:80", "unsupported network"},
		{"nxdomain", "tcp", "nx.test:80", "guard: resolve nx.test"},
		{"no answers", "tcp", "empty.test:80", "no addresses"},
		{"family mismatch", "tcp4", "v6only.test:80", "no addresses"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := d.DialContext(t.Context(), tt.network, tt.addr, nil)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tt.want)
			}
			var de *DeniedError
			if errors.As(err, &de) {
				t.Fatalf("err %v is a DeniedError; want a plain failure", err)
			}
		})
	}
	t.Run("zero dialer", func(t *testing.T) {
		var zd Dialer
		if _, err := zd.DialContext(t.Context(), "tcp", "example.com:80", nil); err == nil || !strings.Contains(err.Error(), "bug()") {
			t.Fatalf("zero Dialer err = %v, want bug()", err)
		}
	})
}

// dnsServer is a minimal UDP DNS responder on 127.0.0.1:0 answering A
// queries from a table (NOERROR with no answers for other types of known
// names, NXDOMAIN for unknown names).
func dnsServer(t *testing.T, table map[string][]netip.Addr) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("dns listen: %v", err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			if resp := dnsAnswer(buf[:n], table); resp != nil {
				pc.WriteTo(resp, from)
			}
		}
	}()
	return pc.LocalAddr().String()
}

func dnsAnswer(q []byte, table map[string][]netip.Addr) []byte {
	if len(q) < 12 || binary.BigEndian.Uint16(q[4:]) != 1 {
		return nil
	}
	var labels []string
	i := 12
	for i < len(q) && q[i] != 0 {
		l := int(q[i])
		if l > 63 || i+1+l > len(q) {
			return nil
		}
		labels = append(labels, strings.ToLower(string(q[i+1:i+1+l])))
		i += 1 + l
	}
	if i+5 > len(q) {
		return nil
	}
	qend := i + 5
	qtype := binary.BigEndian.Uint16(q[i+1:])
	name := strings.Join(labels, ".")
	answers, known := table[name]
	resp := append([]byte{}, q[:qend]...)
	flags := uint16(0x8180) // QR, RD, RA, NOERROR
	if !known {
		flags |= 3 // NXDOMAIN
	}
	binary.BigEndian.PutUint16(resp[2:], flags)
	binary.BigEndian.PutUint16(resp[8:], 0)  // NSCOUNT
	binary.BigEndian.PutUint16(resp[10:], 0) // ARCOUNT
	var an uint16
	for _, a := range answers {
		if qtype != 1 || !a.Is4() {
			continue
		}
		v := a.As4()
		resp = append(resp, 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 0, 0, 4)
		resp = append(resp, v[:]...)
		an++
	}
	binary.BigEndian.PutUint16(resp[6:], an)
	return resp[:len(resp):len(resp)]
}

// TestRealResolver runs the guard with a real net.Resolver whose queries go
// to a DNS server on loopback: mixed and internal answers are refused after
// resolution, a public-only answer reaches the dial hook with its IP.
func TestRealResolver(t *testing.T) {
	srv := dnsServer(t, map[string][]netip.Addr{
		"public.sluice.test":   addrs("93.184.215.14"),
		"internal.sluice.test": addrs("10.0.0.1"),
		"mixed.sluice.test":    addrs("93.184.215.14", "127.0.0.1"),
		"imds.sluice.test":     addrs("169.254.169.254"),
	})
	r := &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var nd net.Dialer
		return nd.DialContext(ctx, "udp", srv)
	}}
	tests := []struct {
		name     string
		addr     string
		want     Class // Public means the dial hook must see wantDial
		wantDial string
	}{
		{"public", "public.sluice.test:443", Public, "93.184.215.14:443"},
		{"internal", "internal.sluice.test:443", Private, ""},
		{"mixed", "mixed.sluice.test:443", Loopback, ""},
		{"metadata", "imds.sluice.test:80", Metadata, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			var dialled []string
			d := New(Options{Resolver: r, DialFunc: func(_ context.Context, _, addr string) (net.Conn, error) {
				dialled = append(dialled, addr)
				return nil, errors.New("test: not dialling")
			}})
			_, err := d.DialContext(ctx, "tcp4", tt.addr, nil)
			if tt.want == Public {
				if fmt.Sprint(dialled) != fmt.Sprint([]string{tt.wantDial}) {
					t.Fatalf("dialled %v (err %v), want [%s]", dialled, err, tt.wantDial)
				}
				return
			}
			var de *DeniedError
			if !errors.As(err, &de) || de.Class != tt.want || len(dialled) != 0 {
				t.Fatalf("err = %v, dialled %v; want DeniedError %s and no dial", err, dialled, tt.want)
			}
		})
	}
}
