package sandboxd

import (
	"encoding/json"
	"fmt"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// The control channel between sandboxd and a sandbox's init is one
// SOCK_SEQPACKET socket pair: each message is one JSON object, optionally
// carrying file descriptors (SCM_RIGHTS). The init trusts only the first
// message (setup); after it confines itself it trusts nothing it receives
// beyond what a confined process may do anyway.

// maxMsg bounds one control message.
const maxMsg = 1 << 20

// setupMsg is sandboxd's first message: how to build the sandbox.
type setupMsg struct {
	Hostname       string `json:"hostname"`
	Rootfs         string `json:"rootfs"`
	RootDir        string `json:"root_dir"` // empty host dir the new root is built on
	RunDir         string `json:"run_dir"`  // host dir bound read-only at /run/sluice
	WorkspaceBytes int64  `json:"workspace_bytes"`
	TmpBytes       int64  `json:"tmp_bytes"`
	UID            int    `json:"uid"`
	GID            int    `json:"gid"`
	ProxyPort      int    `json:"proxy_port"`
	DNSPort        int    `json:"dns_port"`
}

// execMsg asks init to start argv with fds 0-2 attached (SCM_RIGHTS).
type execMsg struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// replyMsg is init's answer: to setup (Error only), to exec (Started, then
// Exited with Code/Signal).
type replyMsg struct {
	Error   string `json:"error,omitempty"`
	Started bool   `json:"started,omitempty"`
	Exited  bool   `json:"exited,omitempty"`
	Code    int    `json:"code"`
	Signal  int    `json:"signal,omitempty"`
}

// ctlConn wraps one end of the control socket.
type ctlConn struct{ c *net.UnixConn }

func newCtlConn(f *os.File) (*ctlConn, error) {
	fc, err := net.FileConn(f)
	if err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	uc, ok := fc.(*net.UnixConn)
	if !ok {
		fc.Close()
		return nil, fmt.Errorf("control: bug(): not a unix socket")
	}
	return &ctlConn{c: uc}, nil
}

func (c *ctlConn) send(v any, fds ...int) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("control: %w", err)
	}
	var oob []byte
	if len(fds) > 0 {
		oob = unix.UnixRights(fds...)
	}
	if _, _, err := c.c.WriteMsgUnix(b, oob, nil); err != nil {
		return fmt.Errorf("control: send: %w", err)
	}
	return nil
}

// recv reads one message into v and returns any received fds (already
// close-on-exec).
func (c *ctlConn) recv(v any) ([]int, error) {
	b := make([]byte, maxMsg)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, flags, _, err := c.c.ReadMsgUnix(b, oob)
	if err != nil {
		return nil, fmt.Errorf("control: recv: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err == nil {
			for _, m := range msgs {
				if f, err := unix.ParseUnixRights(&m); err == nil {
					fds = append(fds, f...)
				}
			}
		}
	}
	closeAll := func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}
	if flags&(unix.MSG_TRUNC|unix.MSG_CTRUNC) != 0 {
		closeAll()
		return nil, fmt.Errorf("control: recv: message truncated")
	}
	if n == 0 {
		closeAll()
		return nil, fmt.Errorf("control: recv: %w", errClosed)
	}
	if err := json.Unmarshal(b[:n], v); err != nil {
		closeAll()
		return nil, fmt.Errorf("control: recv: %w", err)
	}
	return fds, nil
}

func (c *ctlConn) Close() error { return c.c.Close() }
