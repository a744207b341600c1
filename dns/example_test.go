package dns_test

import (
	"context"
	"errors"
	"fmt"
	"net"

	mdns "github.com/miekg/dns"

	"github.com/sluice-gw/sluice/dns"
)

// A stub whose gateway has no DNS answerer yet refuses every question.
func ExampleStub() {
	st := &dns.Stub{Forward: func(context.Context, []byte) ([]byte, error) {
		return nil, errors.New("gateway status 404")
	}}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer pc.Close()
	go st.ServeUDP(pc)

	resp, _, err := new(mdns.Client).Exchange(new(mdns.Msg).SetQuestion("example.com.", mdns.TypeA), pc.LocalAddr().String())
	if err != nil {
		panic(err)
	}
	fmt.Println(mdns.RcodeToString[resp.Rcode])
	// Output: REFUSED
}
