//go:build linux

package dns

import (
	"encoding/binary"
	"errors"
	"net"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// gsoConn is the raw socket of pc for UDP GSO sends, or nil.
func gsoConn(pc net.PacketConn) syscall.RawConn {
	uc, ok := pc.(*net.UDPConn)
	if !ok {
		return nil
	}
	rc, err := uc.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// sendGSO sends the payloads in buf, each of size bytes, to addr with one
// sendmsg and UDP_SEGMENT (UDP GSO, Linux 4.18): the datagrams cross the
// stack as one and are split on delivery, each as if sent alone. It reports
// false, having sent nothing, where the kernel cannot segment (the caller
// then sends them one by one and stops trying).
func sendGSO(rc syscall.RawConn, buf []byte, size int, addr net.Addr) (supported bool, err error) {
	ua, ok := addr.(*net.UDPAddr)
	if !ok {
		return false, nil
	}
	ap := ua.AddrPort()
	if !ap.Addr().Unmap().Is4() {
		return false, nil
	}
	sa := &unix.SockaddrInet4{Port: int(ap.Port()), Addr: ap.Addr().Unmap().As4()}
	var oob [64]byte
	space := unix.CmsgSpace(2)
	h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
	h.Level, h.Type = unix.SOL_UDP, unix.UDP_SEGMENT
	h.SetLen(unix.CmsgLen(2))
	binary.NativeEndian.PutUint16(oob[unix.CmsgLen(0):], uint16(size))
	var serr error
	werr := rc.Write(func(fd uintptr) bool {
		_, serr = unix.SendmsgN(int(fd), buf, oob[:space], sa, 0)
		return !errors.Is(serr, unix.EAGAIN)
	})
	if werr != nil {
		return true, werr // the socket is closed: nothing more to send
	}
	switch {
	case errors.Is(serr, unix.EIO), errors.Is(serr, unix.EINVAL), errors.Is(serr, unix.ENOPROTOOPT), errors.Is(serr, unix.EOPNOTSUPP):
		return false, nil
	}
	return true, serr
}
