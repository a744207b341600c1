package wire

import (
	"context"
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
