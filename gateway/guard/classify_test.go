package guard

import (
	"net/netip"
	"testing"
)

func TestClassify(t *testing.T) {
	tests := []struct {
		name string
		ip   string
		want Class
	}{
		// IPv4.
		{"public v4", "93.184.215.14", Public},
		{"this network RFC1122", "0.0.0.0", Unspecified},
		{"this network high RFC1122", "0.255.1.2", Unspecified},
		{"rfc1918 10/8", "10.0.0.1", Private},
		{"rfc1918 172.16/12", "172.31.255.255", Private},
		{"just outside 172.16/12", "172.32.0.1", Public},
		{"rfc1918 192.168/16", "192.168.1.1", Private},
		{"cgnat RFC6598", "100.64.0.1", CGNAT},
		{"cgnat top RFC6598", "100.127.255.255", CGNAT},
		{"loopback RFC1122", "127.0.0.1", Loopback},
		{"loopback 127/8", "127.255.0.9", Loopback},
		{"imds", "169.254.169.254", Metadata},
		{"ecs task metadata", "169.254.170.2", Metadata},
		{"aws vpc resolver", "169.254.169.253", Metadata},
		{"alibaba metadata", "100.100.100.200", Metadata},
		{"azure wireserver", "168.63.129.16", Metadata},
		{"link-local RFC3927", "169.254.1.1", LinkLocal},
		{"multicast RFC5771", "224.0.0.1", Multicast},
		{"multicast top", "239.255.255.255", Multicast},
		{"class E RFC1112", "240.0.0.1", Reserved},
		{"broadcast", "255.255.255.255", Reserved},
		{"ietf protocol RFC6890", "192.0.0.8", Reserved},
		{"test-net-1 RFC5737", "192.0.2.1", Reserved},
		{"test-net-2 RFC5737", "198.51.100.1", Reserved},
		{"test-net-3 RFC5737", "203.0.113.1", Reserved},
		{"benchmark RFC2544", "198.19.0.1", Reserved},

		// IPv6.
		{"public v6", "2606:4700::1111", Public},
		{"unspecified RFC4291", "::", Unspecified},
		{"loopback RFC4291", "::1", Loopback},
		{"link-local RFC4291", "fe80::1", LinkLocal},
		{"zoned link-local", "fe80::1%eth0", LinkLocal},
		{"zoned public is link-local", "2606:4700::1%eth0", LinkLocal},
		{"ula RFC4193", "fc00::1", Private},
		{"ula fd", "fd12:3456::1", Private},
		{"aws imds v6", "fd00:ec2::254", Metadata},
		{"aws dns v6 is plain ula", "fd00:ec2::253", Private},
		{"site-local RFC3879", "fec0::1", Private},
		{"multicast RFC4291", "ff02::1", Multicast},
		{"documentation RFC3849", "2001:db8::1", Reserved},
		{"documentation RFC9637", "3fff::1", Reserved},
		{"discard RFC6666", "100::1", Reserved},

		// IPv6 forms that carry an IPv4 address.
		{"mapped metadata", "::ffff:169.254.169.254", Metadata},
		{"mapped loopback", "::ffff:127.0.0.1", Loopback},
		{"mapped public", "::ffff:8.8.8.8", Public},
		{"zoned mapped metadata", "::ffff:169.254.169.254%eth0", Metadata},
		{"compatible loopback RFC4291 2.5.5.1", "::127.0.0.1", Loopback},
		{"compatible metadata", "::169.254.169.254", Metadata},
		{"compatible public is reserved", "::8.8.8.8", Reserved},
		{"siit translated RFC2765", "::ffff:0:127.0.0.1", Loopback},
		{"nat64 metadata RFC6052", "64:ff9b::a9fe:a9fe", Metadata},
		{"nat64 loopback", "64:ff9b::7f00:1", Loopback},
		{"nat64 public", "64:ff9b::808:808", Public},
		{"nat64 unassigned", "64:ff9b:2::1", Reserved},
		{"local nat64 /96 RFC8215", "64:ff9b:1::a9fe:a9fe", Metadata},
		{"local nat64 /48", "64:ff9b:1:a9fe:a9:fe00::", Metadata},
		{"local nat64 /96 public", "64:ff9b:1::808:808", Public},
		{"local nat64 /96 private", "64:ff9b:1::a00:1", Private},
		// Other RFC 6052 positions hold public 8.8.127.0, 8.127.0.0 and 1.0.0.0 here.
		{"local nat64 /64", "64:ff9b:1:808:7f:0:100:0", Loopback},
		{"6to4 metadata RFC3056", "2002:a9fe:a9fe::1", Metadata},
		{"6to4 private", "2002:0a00:0001::", Private},
		{"6to4 public", "2002:0808:0808::1", Public},
		// Teredo client 127.0.0.1 is stored inverted: 80ff:fffe.
		{"teredo client loopback RFC4380", "2001:0:4136:e378:8000:63bf:80ff:fffe", Loopback},
		// Teredo server 169.254.169.254 with a public client (8.8.8.8 inverted).
		{"teredo server metadata", "2001:0:a9fe:a9fe::f7f7:f7f7", Metadata},
		{"teredo public", "2001:0:4136:e378:8000:63bf:f7f7:f7f7", Public},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip := netip.MustParseAddr(tt.ip)
			if got := Classify(ip); got != tt.want {
				t.Errorf("Classify(%s) = %s, want %s", tt.ip, got, tt.want)
			}
		})
	}
	t.Run("invalid addr", func(t *testing.T) {
		if got := Classify(netip.Addr{}); got != Unspecified {
			t.Errorf("Classify(zero) = %s, want unspecified", got)
		}
	})
}

func TestClassString(t *testing.T) {
	for c, want := range map[Class]string{Public: "public", Loopback: "loopback", CGNAT: "cgnat",
		LinkLocal: "link-local", Metadata: "metadata", Self: "self", Class(99): "class(99)"} {
		if got := c.String(); got != want {
			t.Errorf("Class(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}

func TestAdmitted(t *testing.T) {
	all := []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("::/0")}
	tests := []struct {
		name  string
		ip    string
		allow []netip.Prefix
		want  bool
	}{
		{"public without allow", "8.8.8.8", nil, true},
		{"private without allow", "10.0.0.1", nil, false},
		{"private inside allow", "10.0.0.1", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, true},
		{"private outside allow", "10.0.1.1", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/24")}, false},
		{"mapped private, v4 allow", "::ffff:10.0.0.1", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, true},
		{"private, mapped allow", "10.0.0.1", []netip.Prefix{netip.MustParsePrefix("::ffff:10.0.0.0/104")}, true},
		{"6to4 private is not admitted by v4 allow", "2002:0a00:0001::", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}, false},
		{"metadata never", "169.254.169.254", all, false},
		{"metadata v6 never", "fd00:ec2::254", all, false},
		{"unspecified never", "0.0.0.0", all, false},
		{"multicast never", "ff02::1", all, false},
		{"zoned link-local", "fe80::1%eth0", []netip.Prefix{netip.MustParsePrefix("fe80::/10")}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ip := netip.MustParseAddr(tt.ip)
			if got := Admitted(Classify(ip), ip, tt.allow); got != tt.want {
				t.Errorf("Admitted(%s, %s, %v) = %v, want %v", Classify(ip), tt.ip, tt.allow, got, tt.want)
			}
		})
	}
}

func TestControlRechecks(t *testing.T) {
	// The dial-time hook is the second lock: it must refuse on its own,
	// whatever reached the net.Dialer.
	d := New(Options{})
	ctl := d.control(nil)
	tests := []struct {
		name    string
		address string
		want    Class
	}{
		{"loopback", "127.0.0.1:80", Loopback},
		{"metadata", "169.254.169.254:80", Metadata},
		{"mapped metadata", "[::ffff:169.254.169.254]:80", Metadata},
		{"zoned link-local", "[fe80::1%lo]:80", LinkLocal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := ctl("tcp", tt.address, nil)
			de, ok := err.(*DeniedError)
			if !ok || de.Class != tt.want {
				t.Fatalf("control(%s) = %v, want DeniedError %s", tt.address, err, tt.want)
			}
		})
	}
	t.Run("unparsable", func(t *testing.T) {
		if err := ctl("tcp", "localhost:80", nil); err == nil {
			t.Fatal("control accepted a name")
		}
	})
	t.Run("public passes", func(t *testing.T) {
		if err := ctl("tcp", "8.8.8.8:443", nil); err != nil {
			t.Fatalf("control(8.8.8.8) = %v", err)
		}
	})
	t.Run("allowed loopback passes", func(t *testing.T) {
		ctl := d.control([]netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
		if err := ctl("tcp", "127.0.0.1:80", nil); err != nil {
			t.Fatalf("control(127.0.0.1) with allow = %v", err)
		}
	})
}

// FuzzClassify builds every IPv6 form that embeds the IPv4 address in the
// fuzzed bytes and checks that a refused IPv4 address is refused in each.
func FuzzClassify(f *testing.F) {
	f.Add([]byte{169, 254, 169, 254, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}) // metadata
	f.Add([]byte{127, 0, 0, 1, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12})    // loopback plus noise
	f.Add([]byte{8, 8, 8, 8, 0xfd, 0, 0xe, 0xc2, 0, 0, 0, 0, 0, 0, 2, 0x54})
	f.Add([]byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}) // all-zero v4, ::1 raw
	f.Fuzz(func(t *testing.T, raw []byte) {
		var b [16]byte
		copy(b[:], raw)
		raw16 := netip.AddrFrom16(b)
		if c := Classify(raw16); c < Public || c > Self {
			t.Fatalf("Classify(%s) = %d, out of range", raw16, int(c))
		}
		var v4b [4]byte
		copy(v4b[:], b[:4])
		v4 := netip.AddrFrom4(v4b)
		want := Classify(v4)
		if want == Public {
			return
		}
		rest := b[4:]
		forms := map[string][16]byte{}
		var f16 [16]byte
		// IPv4-mapped.
		f16 = [16]byte{10: 0xff, 11: 0xff}
		copy(f16[12:], v4b[:])
		forms["mapped"] = f16
		// NAT64 well-known /96.
		f16 = [16]byte{0: 0x00, 1: 0x64, 2: 0xff, 3: 0x9b}
		copy(f16[12:], v4b[:])
		forms["nat64"] = f16
		// Local-use NAT64 /96.
		f16 = [16]byte{0: 0x00, 1: 0x64, 2: 0xff, 3: 0x9b, 5: 1}
		copy(f16[12:], v4b[:])
		forms["nat64-local"] = f16
		// 6to4 with arbitrary subnet and interface bits.
		f16 = [16]byte{0: 0x20, 1: 0x02}
		copy(f16[2:6], v4b[:])
		copy(f16[6:], rest)
		forms["6to4"] = f16
		// Teredo client (inverted), arbitrary server, flags and port.
		f16 = [16]byte{0: 0x20, 1: 0x01}
		copy(f16[4:12], rest)
		for i := range 4 {
			f16[12+i] = v4b[i] ^ 0xff
		}
		forms["teredo-client"] = f16
		// Teredo server, arbitrary client.
		f16 = [16]byte{0: 0x20, 1: 0x01}
		copy(f16[4:8], v4b[:])
		copy(f16[8:], rest)
		forms["teredo-server"] = f16
		// IPv4-compatible; 0.0.0.0 and 0.0.0.1 are :: and ::1, also refused.
		f16 = [16]byte{}
		copy(f16[12:], v4b[:])
		forms["compatible"] = f16
		for name, a := range forms {
			ip := netip.AddrFrom16(a)
			if got := Classify(ip); got == Public {
				t.Errorf("%s form %s of %s (%s) classified public", name, ip, v4, want)
			}
		}
	})
}

func BenchmarkClassify(b *testing.B) {
	ips := []netip.Addr{
		netip.MustParseAddr("93.184.215.14"),
		netip.MustParseAddr("169.254.169.254"),
		netip.MustParseAddr("2606:4700::1111"),
		netip.MustParseAddr("2002:a9fe:a9fe::1"),
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		Classify(ips[i%len(ips)])
	}
}
