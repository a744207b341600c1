package gateway

import "net"

// kernelRelay relays a tunnel between two TCP sockets inside the kernel
// when it can, and reports whether it did (the tunnel is then over). When
// it cannot, it returns false before touching either socket, and the
// tunnel is relayed by relayTCP.
func (e *rawEgress) kernelRelay(closer net.Conn, client, up *net.TCPConn, c *egressCall) bool {
	return false
}
