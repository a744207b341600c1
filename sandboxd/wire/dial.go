package wire

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"time"
)

// Dial connects to a gateway's sandbox socket at path and writes id's
// preamble, as sandboxd's relay does for every connection: what follows on
// the returned connection speaks for that identity. The connect and the
// preamble's write are bounded by ctx's deadline, if it has one.
func Dial(ctx context.Context, path string, id Identity) (net.Conn, error) {
	line, err := Encode(id)
	if err != nil {
		return nil, err
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err != nil {
		return nil, fmt.Errorf("wire: dial %s: %w", path, err)
	}
	return sendPreamble(ctx, c, line)
}

// sendPreamble writes line on c within ctx's deadline, closing c if it
// cannot.
func sendPreamble(ctx context.Context, c net.Conn, line []byte) (net.Conn, error) {
	if dl, ok := ctx.Deadline(); ok {
		_ = c.SetWriteDeadline(dl)
	}
	if _, err := c.Write(line); err != nil {
		c.Close()
		return nil, fmt.Errorf("wire: write preamble: %w", err)
	}
	_ = c.SetWriteDeadline(time.Time{})
	return c, nil
}

// DialTLS connects to a gateway's relay listener for remote relays at
// addr (gateway.relay_tls) with cfg, which carries the relay's client
// certificate and the CA the gateway's certificate is checked against,
// and writes id's preamble, as Dial does on the Unix socket. id.Host must
// be a DNS name of the client certificate, or the gateway refuses.
func DialTLS(ctx context.Context, addr string, cfg *tls.Config, id Identity) (net.Conn, error) {
	line, err := Encode(id)
	if err != nil {
		return nil, err
	}
	d := tls.Dialer{Config: cfg}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("wire: dial %s: %w", addr, err)
	}
	return sendPreamble(ctx, c, line)
}
