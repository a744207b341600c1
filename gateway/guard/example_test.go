package guard_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/sluice-gw/sluice/gateway/guard"
)

func ExampleClassify() {
	for _, s := range []string{"93.184.215.14", "169.254.169.254", "64:ff9b::a9fe:a9fe", "2002:a9fe:a9fe::1", "fe80::1%eth0"} {
		fmt.Println(s, guard.Classify(netip.MustParseAddr(s)))
	}
	// Output:
	// 93.184.215.14 public
	// 169.254.169.254 metadata
	// 64:ff9b::a9fe:a9fe metadata
	// 2002:a9fe:a9fe::1 metadata
	// fe80::1%eth0 link-local
}

func ExampleParseAuthority() {
	host, port, _ := guard.ParseAuthority("0x7f.1:8080", "")
	fmt.Println(host, port)
	host, port, _ = guard.ParseAuthority("API.Example.COM.", "443")
	fmt.Println(host, port)
	_, _, err := guard.ParseAuthority("user:secret@example.com:80", "")
	fmt.Println(err)
	// Output:
	// 127.0.0.1 8080
	// api.example.com 443
	// guard: parse authority: userinfo not allowed
}

func ExampleDialer_DialContext() {
	d := guard.New(guard.Options{})
	_, err := d.DialContext(context.Background(), "tcp", "[::ffff:169.254.169.254]:80", nil)
	var de *guard.DeniedError
	if errors.As(err, &de) {
		fmt.Println(de.Class)
	}
	// Output:
	// metadata
}
