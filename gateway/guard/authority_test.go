package guard

import (
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"
)

func TestParseAuthority(t *testing.T) {
	tests := []struct {
		name      string
		in        string
		def       string
		wantHost  string
		wantPort  string
		wantError string // substring of AuthorityError.Reason; "" means success
	}{
		// Canonical forms.
		{"name and port", "Example.COM:443", "", "example.com", "443", ""},
		{"trailing dot F4", "example.com.:443", "", "example.com", "443", ""},
		{"default port", "example.com", "443", "example.com", "443", ""},
		{"default port trailing dot", "api.example.com.", "80", "api.example.com", "80", ""},
		{"punycode", "xn--bcher-kva.example:443", "", "xn--bcher-kva.example", "443", ""},
		{"underscore label", "_dmarc.example.com:80", "", "_dmarc.example.com", "80", ""},
		{"port 65535", "example.com:65535", "", "example.com", "65535", ""},
		{"port 1", "example.com:1", "", "example.com", "1", ""},
		{"dotted quad", "10.0.0.1:80", "", "10.0.0.1", "80", ""},

		// inet_aton spellings, THREATS C2.
		{"decimal dword", "2130706433:80", "", "127.0.0.1", "80", ""},
		{"hex dword", "0x7f000001:80", "", "127.0.0.1", "80", ""},
		{"hex dword upper", "0X7F000001:80", "", "127.0.0.1", "80", ""},
		{"octal first", "0177.0.0.1:80", "", "127.0.0.1", "80", ""},
		{"two parts", "127.1:80", "", "127.0.0.1", "80", ""},
		{"three parts", "127.0.1:80", "", "127.0.0.1", "80", ""},
		{"hex and short", "0x7f.1:80", "", "127.0.0.1", "80", ""},
		{"zero", "0:80", "", "0.0.0.0", "80", ""},
		{"bare 0x", "0x:80", "", "0.0.0.0", "80", ""},
		{"metadata octal hex mix", "0251.0xfe.0251.254:80", "", "169.254.169.254", "80", ""},
		{"metadata dword", "2852039166:80", "", "169.254.169.254", "80", ""},
		{"numeric with trailing dot", "127.0.0.1.:80", "", "127.0.0.1", "80", ""},
		{"leading zeros decimal are octal", "010.0.0.1:80", "", "8.0.0.1", "80", ""},

		// IPv6.
		{"unspecified v6", "[::]:80", "", "::", "80", ""},
		{"v6 default port", "[::1]", "443", "::1", "443", ""},
		{"v6 canonical", "[FD00:EC2:0::254]:80", "", "fd00:ec2::254", "80", ""},
		{"v6 mapped", "[::ffff:169.254.169.254]:80", "", "::ffff:169.254.169.254", "80", ""},

		// Refusals, THREATS F4.
		{"empty", "", "", "", "", "empty authority"},
		{"userinfo", "user@example.com:80", "", "", "", "userinfo"},
		{"userinfo with password", "user:pw@example.com:80", "", "", "", "userinfo"},
		{"empty host", ":80", "", "", "", "empty host"},
		{"only dot", ".:80", "", "", "", "empty host"},
		{"two trailing dots", "example.com..:80", "", "", "", "empty label"},
		{"leading dot", ".example.com:80", "", "", "", "empty label"},
		{"port leading zero", "example.com:007", "", "", "", "port must be"},
		{"port too large", "example.com:91337", "", "", "", "port must be"},
		{"port 65536", "example.com:65536", "", "", "", "port must be"},
		{"port zero", "example.com:0", "", "", "", "port must be"},
		{"port negative", "example.com:-1", "", "", "", "port must be"},
		{"port plus", "example.com:+80", "", "", "", "port must be"},
		{"port hex", "example.com:0x50", "", "", "", "port must be"},
		{"port empty", "example.com:", "", "", "", "empty port"},
		{"missing port", "example.com", "", "", "", "missing port"},
		{"bad default port", "example.com", "080", "", "", "port must be"},
		{"double brackets", "[[::1]]:80", "", "", "", "brackets"},
		{"bracketed v4", "[127.0.0.1]:80", "", "", "", "not an IPv6"},
		{"bracketed name", "[example.com]:80", "", "", "", "not an IPv6"},
		{"unclosed bracket", "[::1:80", "", "", "", "missing ']'"},
		{"junk after bracket", "[::1]x:80", "", "", "", "junk"},
		{"stray bracket", "example.com]:80", "", "", "", "stray bracket"},
		{"bare v6", "::1:80", "", "", "", "must be in brackets"},
		{"zone", "[fe80::1%25eth0]:80", "", "", "", "zone"},
		{"space", "exa mple.com:80", "", "", "", "control"},
		{"tab", "example.com\t:80", "", "", "", "control"},
		{"nul", "example.com\x00:80", "", "", "", "control"},
		{"cr lf", "example.com\r\n:80", "", "", "", "control"},
		{"del", "example.com\x7f:80", "", "", "", "control"},
		{"idn", "bücher.example:443", "", "", "", "punycode"},
		{"slash", "example.com/x:80", "", "", "", "invalid character"},
		{"backslash", "example.com\\@x:80", "", "", "", "userinfo"},
		{"label too long", strings.Repeat("a", 64) + ".com:80", "", "", "", "label longer"},
		{"name too long", strings.Repeat("a.", 127) + "com:80", "", "", "", "longer than 253"},
		{"five numeric parts", "1.2.3.4.5:80", "", "", "", "numeric"},
		{"octet too large", "256.0.0.1:80", "", "", "", "numeric"},
		{"last part too large", "127.16777216:80", "", "", "", "numeric"},
		{"dword too large", "4294967296:80", "", "", "", "numeric"},
		{"bad octal", "08.0.0.1:80", "", "", "", "numeric"},
		{"name ending in number", "example.123:80", "", "", "", "numeric"},
		{"name ending in hex", "example.0x1:80", "", "", "", "numeric"},
		{"too long", strings.Repeat("a", 600) + ":80", "", "", "", "too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			host, port, err := ParseAuthority(tt.in, tt.def)
			if tt.wantError != "" {
				var ae *AuthorityError
				if !errors.As(err, &ae) {
					t.Fatalf("ParseAuthority(%q) = %q, %q, %v; want AuthorityError", tt.in, host, port, err)
				}
				if !strings.Contains(ae.Reason, tt.wantError) {
					t.Fatalf("reason %q, want it to contain %q", ae.Reason, tt.wantError)
				}
				if strings.Contains(err.Error(), "pw") {
					t.Fatalf("error %q repeats the input", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseAuthority(%q) error: %v", tt.in, err)
			}
			if host != tt.wantHost || port != tt.wantPort {
				t.Fatalf("ParseAuthority(%q) = %q, %q; want %q, %q", tt.in, host, port, tt.wantHost, tt.wantPort)
			}
		})
	}
}

func FuzzParseAuthority(f *testing.F) {
	f.Add("example.com:443")              // plain name
	f.Add("Example.COM.:80")              // case and trailing dot
	f.Add("2130706433:80")                // decimal dword
	f.Add("0x7f.1:80")                    // hex and short form
	f.Add("0177.0.0.1:80")                // octal
	f.Add("[::ffff:169.254.169.254]:443") // mapped IPv6
	f.Add("[[::1]]:80")                   // nested brackets
	f.Add("user:pass@host:80")            // userinfo
	f.Add("host:007")                     // leading-zero port
	f.Add("bücher.example:443")           // IDN
	f.Add("1.2.3.4.5:80")                 // too many numeric parts
	f.Add("example.com")                  // no port
	f.Fuzz(func(t *testing.T, in string) {
		host, port, err := ParseAuthority(in, "443")
		if err != nil {
			var ae *AuthorityError
			if !errors.As(err, &ae) {
				t.Fatalf("error %v is not an AuthorityError", err)
			}
			return
		}
		if host == "" || strings.ToLower(host) != host || strings.HasSuffix(host, ".") {
			t.Fatalf("host %q not canonical (from %q)", host, in)
		}
		if !validPort(port) {
			t.Fatalf("port %q invalid (from %q)", port, in)
		}
		labels := strings.Split(host, ".")
		if isNumberLabel(labels[len(labels)-1]) && !strings.Contains(host, ":") {
			if a, perr := netip.ParseAddr(host); perr != nil || !a.Is4() {
				t.Fatalf("numeric host %q is not a dotted quad (from %q)", host, in)
			}
		}
		h2, p2, err := ParseAuthority(net.JoinHostPort(host, port), "")
		if err != nil || h2 != host || p2 != port {
			t.Fatalf("re-parse of %q:%q = %q, %q, %v", host, port, h2, p2, err)
		}
	})
}

func BenchmarkParseAuthority(b *testing.B) {
	ins := []string{"api.example.com:443", "0x7f000001:80", "[2606:4700::1111]:443", "10.0.0.1:8080"}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, _, err := ParseAuthority(ins[i%len(ins)], ""); err != nil {
			b.Fatal(err)
		}
	}
}
