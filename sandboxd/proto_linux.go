package sandboxd

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// The control channel between sandboxd and a sandbox's init is one
// SOCK_SEQPACKET socket pair: each message is one JSON object, optionally
// carrying file descriptors (SCM_RIGHTS). The init trusts only the first
// message (setup); after it confines itself it trusts nothing it receives
// beyond what a confined process may do anyway.

// maxMsg bounds one control message; maxReply one of init's replies (the
// only messages sandboxd reads).
const (
	maxMsg   = 1 << 20
	maxReply = 64 << 10
)

// setupMsg is sandboxd's first message: how to build the sandbox.
type setupMsg struct {
	Hostname       string `json:"hostname"`
	Template       string `json:"template"` // the mount template, in the init's mount namespace
	RootDir        string `json:"root_dir"` // empty host dir the new root is built on
	RunDir         string `json:"run_dir"`  // host dir bound read-only at /run/sluice
	EtcDir         string `json:"etc_dir"`  // host dir with this sandbox's hosts and hostname
	WorkspaceBytes int64  `json:"workspace_bytes"`
	TmpBytes       int64  `json:"tmp_bytes"`
	UID            int    `json:"uid"` // the commands' uid and gid
	GID            int    `json:"gid"`
	InitUID        int    `json:"init_uid"` // the init's own uid, never UID (THREATS A13)
	ProxyPort      int    `json:"proxy_port"`
	DNSPort        int    `json:"dns_port"`
	// Affinity is the CPU mask (unix.CPUSet's words) the init gives all
	// its threads once confined: sandboxd starts it on one CPU (empty:
	// it was not; the init then pins itself for confine).
	Affinity []uint64 `json:"affinity,omitempty"`
	// Seccomp is the filter program (assembled once by sandboxd) in its
	// wire form (encodeSeccomp): one base64 string in the JSON, which the
	// init decodes far faster than an array of instruction objects.
	Seccomp []byte `json:"seccomp"`
	// CtlSock, when set, is where the init listens (SOCK_SEQPACKET) for a
	// new sandboxd once its control socket closes: a sandboxd killed or
	// restarted leaves the sandbox running, and the next one re-adopts
	// it there (adopt_linux.go). A host path outside the sandbox's root;
	// the init accepts only peers outside its pid namespace. AdoptWaitMS
	// is how long it waits before it exits (and with it the sandbox).
	CtlSock     string `json:"ctl_sock,omitempty"`
	AdoptWaitMS int64  `json:"adopt_wait_ms,omitempty"`
}

// execMsg asks init to start argv with fds 0-2 attached (SCM_RIGHTS).
type execMsg struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Dir  string   `json:"dir"`
}

// replyMsg is init's answer: to setup (NetReady once lo is up, then an
// empty reply or Error), to exec (Started, then Exited with Code/Signal).
type replyMsg struct {
	Error    string `json:"error,omitempty"`
	NetReady bool   `json:"net_ready,omitempty"`
	Started  bool   `json:"started,omitempty"`
	Exited   bool   `json:"exited,omitempty"`
	Code     int    `json:"code"`
	Signal   int    `json:"signal,omitempty"`
}

// ctlConn wraps one end of the control socket. One goroutine at a time
// receives on it (setup, then Exec under the sandbox's execMu; in the init
// its one loop), so the receive buffer is reused: allocating (and so
// zeroing and faulting in) a fresh maximum-size buffer per message showed
// up as a large share of an exec's cost. sandboxd's ends take theirs from
// a pool shared by all sandboxes (replyBufs): one per sandbox showed up as
// a share of every create.
//
// sandboxd's end is a net.UnixConn (deadlines, the poller). The init's end
// is its blocking descriptor, used with plain recvmsg/sendmsg on the init's
// one locked thread: waiting in the poller would need a second thread to
// poll and a hand-over back to the locked one on every message, and every
// extra thread makes each all-threads privilege call in confine slower.
type ctlConn struct {
	c   *net.UnixConn // sandboxd's end; nil in the init
	fd  int           // the init's blocking descriptor
	max int           // largest message accepted (default maxMsg)
	buf []byte
}

// newInitCtlConn uses fd, made blocking, as the init's end.
func newInitCtlConn(fd int) (*ctlConn, error) {
	if err := unix.SetNonblock(fd, false); err != nil {
		return nil, fmt.Errorf("control: %w", err)
	}
	return &ctlConn{fd: fd, max: maxMsg}, nil
}

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
	return &ctlConn{c: uc, max: maxMsg}, nil
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
	if c.c != nil {
		_, _, err = c.c.WriteMsgUnix(b, oob, nil)
	} else {
		for {
			if _, err = unix.SendmsgN(c.fd, b, oob, nil, unix.MSG_NOSIGNAL); err != unix.EINTR {
				break
			}
		}
	}
	if err != nil {
		return fmt.Errorf("control: send: %w", err)
	}
	return nil
}

// recv reads one message into v and returns any received fds (already
// close-on-exec).
func (c *ctlConn) recv(v any) ([]int, error) {
	var b []byte
	if c.c != nil && c.max == maxReply {
		// sandboxd's ends share their buffers: one per sandbox would
		// be zeroed (and faulted in) for every sandbox created.
		bp := replyBufs.Get().(*[]byte)
		defer replyBufs.Put(bp)
		b = *bp
	} else {
		if c.buf == nil {
			c.buf = make([]byte, c.max)
		}
		b = c.buf
	}
	var oobArr [64]byte // >= CmsgSpace(3*4)
	oob := oobArr[:unix.CmsgSpace(3*4)]
	var n, oobn, flags int
	var err error
	if c.c != nil {
		n, oobn, flags, _, err = c.c.ReadMsgUnix(b, oob)
	} else {
		for {
			if n, oobn, flags, _, err = unix.Recvmsg(c.fd, b, oob, unix.MSG_CMSG_CLOEXEC); err != unix.EINTR {
				break
			}
		}
	}
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

// replyBufs hold maxReply bytes each, for sandboxd's ends of the control
// sockets.
var replyBufs = sync.Pool{New: func() any {
	b := make([]byte, maxReply)
	return &b
}}

func (c *ctlConn) Close() error {
	if c.c != nil {
		return c.c.Close()
	}
	return unix.Close(c.fd)
}
