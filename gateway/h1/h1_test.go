package h1_test

import (
	"fmt"
	"testing"

	"github.com/sluice-gw/sluice/gateway/h1"
)

func TestCheckFieldLine(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		ok         bool
	}{
		{"plain", "Host: example.com", true},
		{"empty value", "X-Empty:", true},
		{"tab in value", "X-A: a\tb", true},
		{"obs-fold (RFC 9112 5.2)", " continued", false},
		{"obs-fold with a tab", "\tcontinued", false},
		{"no colon", "Host example.com", false},
		{"empty name", ": v", false},
		{"space before the colon (RFC 9112 5.1)", "Host : example.com", false},
		{"byte over 0x7f in a name (RFC 9110 5.1)", "Hö: v", false},
		{"NUL in a value (RFC 9110 5.5)", "X-A: a\x00b", false},
		{"DEL in a value", "X-A: a\x7f", false},
		{"CR in a value", "X-A: a\rb", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := h1.CheckFieldLine([]byte(tc.line))
			if (err == nil) != tc.ok {
				t.Fatalf("CheckFieldLine(%q) = %v, want ok=%v", tc.line, err, tc.ok)
			}
		})
	}
}

func TestName(t *testing.T) {
	for in, want := range map[string]h1.Field{
		"Content-Length": h1.ContentLength, "content-length": h1.ContentLength,
		"TRANSFER-ENCODING": h1.TransferEncoding, "host": h1.Host, "Expect": h1.Expect,
		"connection": h1.Connection, "Content-Lengths": h1.Other, "": h1.Other, "X-Host": h1.Other,
	} {
		if got := h1.Name([]byte(in)); got != want {
			t.Errorf("Name(%q) = %v, want %v", in, got, want)
		}
	}
}

func TestHasToken(t *testing.T) {
	for _, tc := range []struct {
		v, token string
		want     bool
	}{
		{"100-continue", "100-continue", true},
		{"100-Continue", "100-continue", true},
		{"keep-alive, Upgrade", "upgrade", true},
		{"x100-continue", "100-continue", false},
		{"100-continuex", "100-continue", false},
		{"", "close", false},
	} {
		if got := h1.HasToken(tc.v, tc.token); got != tc.want {
			t.Errorf("HasToken(%q, %q) = %v, want %v", tc.v, tc.token, got, tc.want)
		}
	}
}

func TestValidHost(t *testing.T) {
	for h, want := range map[string]bool{"example.com:443": true, "[::1]:80": true, "a b": false, "a/b": false, "a\x00": false} {
		if got := h1.ValidHost(h); got != want {
			t.Errorf("ValidHost(%q) = %v, want %v", h, got, want)
		}
	}
}

func ExampleSplitField() {
	l := []byte("Content-Length:  42 ")
	if err := h1.CheckFieldLine(l); err != nil {
		panic(err)
	}
	name, value := h1.SplitField(l)
	fmt.Printf("%v %q\n", h1.Name(name), value)
	// Output: Content-Length "42"
}
