// Command agent is the code a test runs inside a sandbox: it calls the
// gateway the two ways a sandbox can (the TCP listener sandboxd opens at
// 127.0.0.1:3128 and the bind-mounted Unix socket) and one way it must not
// (a host loopback address it was given), printing one line per attempt.
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"time"
)

func main() {
	tool := os.Args[1]
	forbidden := os.Args[2] // host:port of a listener on the host's loopback
	try := func(name string, c *http.Client, url string) {
		resp, err := c.Post(url, "application/json", strings.NewReader(`{"query":{"limit":3}}`))
		if err != nil {
			fmt.Printf("%s error %v\n", name, err)
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		fmt.Printf("%s %d %s\n", name, resp.StatusCode, strings.ReplaceAll(string(b), "\n", " "))
	}
	tcp := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Proxy: nil}}
	try("tcp", tcp, "http://127.0.0.1:3128/v1/tools/"+tool)
	unixc := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", "/run/sluice/gateway.sock")
		},
	}}
	try("unix", unixc, "http://sluice/v1/tools/"+tool)
	c, err := net.DialTimeout("tcp", forbidden, 3*time.Second)
	if err == nil {
		c.Close()
		fmt.Println("escape connected")
		return
	}
	fmt.Printf("escape error %v\n", err)
}
