//go:build !linux

package dns

import (
	"net"
	"syscall"
)

func gsoConn(net.PacketConn) syscall.RawConn { return nil }

func sendGSO(syscall.RawConn, []byte, int, net.Addr) (bool, error) { return false, nil }
