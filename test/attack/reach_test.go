//go:build linux

package attack

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/test/internal/casebook"
)

// hostileCase is one run of the helper in a fresh sandbox made by the
// sandboxd binary, its verdict compared exactly.
type hostileCase struct {
	threat, name string
	args         []string
	want         string
}

func runHostileCases(t *testing.T, cases []hostileCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.threat+"/"+tc.name, func(t *testing.T) {
			c := casebook.Expect(t, tc.threat, tc.name+" (in a fresh sandbox)", tc.want)
			r := runHostile(t, nil, tc.args...)
			c.Observe(verdict(r))
			if r.stdout != tc.want {
				t.Errorf("%s: got %q (exit %d, stderr %q), want %q", tc.threat, r.stdout, r.code, r.stderr, tc.want)
			}
		})
	}
}

// TestSocketFamilies is THREATS A11: socket() takes only AF_UNIX, AF_INET,
// AF_INET6 and AF_NETLINK (NETLINK_ROUTE only), whatever the other 32 bits
// of the register hold; everything else fails at socket() with
// EAFNOSUPPORT (EPROTONOSUPPORT for another netlink protocol) before any
// address is named. AF_VSOCK is loaded on this host (a VM): outside a
// sandbox it opens. Nothing here connects anywhere.
func TestSocketFamilies(t *testing.T) {
	need(t)
	cases := []hostileCase{
		{"A11", "every family 0..AF_MAX+3 and 5 values with high bits set: only 1,2,10,16 open, every other EAFNOSUPPORT",
			[]string{"socket-families"}, "open=1,2,10,16 other=none n=55"},
		{"A11", "socketpair over the same families: AF_UNIX only", []string{"socketpair-families"}, "open=1 other=none n=55"},
		{"A11", "AF_VSOCK stream socket (the hypervisor's side)", []string{"socket", "40,1,0"}, "errno=EAFNOSUPPORT"},
		{"A11", "AF_VSOCK with bit 32 set (the kernel would drop it)", []string{"socket", "0x100000028,1,0"}, "errno=EAFNOSUPPORT"},
		{"A11", "AF_ALG", []string{"socket", "38,5,0"}, "errno=EAFNOSUPPORT"},
		{"A11", "AF_XDP", []string{"socket", "44,3,0"}, "errno=EAFNOSUPPORT"},
		{"A11", "AF_TIPC", []string{"socket", "30,5,0"}, "errno=EAFNOSUPPORT"},
		{"A11", "AF_BLUETOOTH", []string{"socket", "31,3,0"}, "errno=EAFNOSUPPORT"},
		{"A11", "netlink protocols 0..31 and 2 with high bits: NETLINK_ROUTE only, every other EPROTONOSUPPORT",
			[]string{"netlink-protocols"}, "open=0 other=none n=34"},
		{"A11", "control: NETLINK_ROUTE lists lo; adding an address to it is refused (no CAP_NET_ADMIN)",
			[]string{"netlink-route"}, "read=lo write=errno=EPERM"},
		{"A11", "SCTP over IPv4 (Landlock's TCP rule does not see it)", []string{"socket", "2,1,132"}, "errno=EPERM"},
		{"A11", "SCTP over IPv6, seqpacket", []string{"socket", "10,5,132"}, "errno=EPERM"},
		{"A11", "UDP-Lite", []string{"socket", "2,2,136"}, "errno=EPERM"},
		{"A11", "control: IPv6 TCP socket", []string{"socket", "10,1,0"}, "ok"},
		{"A11", "control: UDP socket, protocol named", []string{"socket", "2,2,17"}, "ok"},
	}
	if runtime.GOARCH == "amd64" {
		// int $0x80 is i386's entry: its system calls carry another
		// architecture, which the library's program let through whole.
		cases = append(cases,
			hostileCase{"A11", "i386 socket(AF_VSOCK) through int 0x80", []string{"int80", "359,40,1,0"}, "errno=ENOSYS"},
			hostileCase{"A11", "i386 unshare(CLONE_NEWUSER) through int 0x80", []string{"int80", "310,0x10000000,0,0"}, "errno=ENOSYS"},
			hostileCase{"A11", "i386 getpid through int 0x80", []string{"int80", "20,0,0,0"}, "errno=ENOSYS"})
	}
	runHostileCases(t, cases)
}

// TestTCPFastOpen is THREATS A12: a Fast Open connect sends its SYN from
// sendto/sendmsg/sendmmsg, past the connect hook Landlock's TCP rule is on.
// The target is a listener this test runs on the host's loopback, on a
// port Landlock forbids: every Fast Open form fails with EPERM from the
// filter, TCP_FASTOPEN_CONNECT too, and the sandbox's network namespace
// has Fast Open off (net.ipv4.tcp_fastopen = 0; the kernel's refusal
// without the filter is TestNSSetTCPFastOpenOff in sandboxd). The
// listener accepts nothing.
func TestTCPFastOpen(t *testing.T) {
	need(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var accepted atomic.Int64
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted.Add(1)
			c.Close()
		}
	}()
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	runHostileCases(t, []hostileCase{
		{"A12", "sendto MSG_FASTOPEN to a host loopback listener on a forbidden port", []string{"tfo-sendto", port}, "errno=EPERM"},
		{"A12", "sendto MSG_FASTOPEN|MSG_DONTWAIT with bit 32 of the flags set", []string{"tfo-sendto-hi", port}, "errno=EPERM"},
		{"A12", "sendmsg MSG_FASTOPEN", []string{"tfo-sendmsg", port}, "errno=EPERM"},
		{"A12", "sendmmsg MSG_FASTOPEN", []string{"tfo-sendmmsg", port}, "errno=EPERM"},
		{"A12", "setsockopt TCP_FASTOPEN_CONNECT", []string{"tfo-connect-opt"}, "errno=EPERM"},
		{"A12", "setsockopt TCP_FASTOPEN_CONNECT, level and option with bit 32 set", []string{"tfo-connect-opt-hi"}, "errno=EPERM"},
		{"A12", "net.ipv4.tcp_fastopen in the sandbox's network namespace", []string{"cat", "/proc/sys/net/ipv4/tcp_fastopen"}, "0"},
		{"A12", "control: setsockopt TCP_NODELAY", []string{"control-nodelay"}, "ok"},
	})
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host listener accepted %d connections", n)
	}
}

// createWithHostile creates a sandbox through the API and copies the
// helper into its workspace; it returns the sandbox's id and host pid.
func createWithHostile(t *testing.T, do apiDo, body string) (string, int) {
	t.Helper()
	code, b := do("POST", "/v1/sandboxes", strings.NewReader(body))
	var info struct {
		ID  string
		Pid int
	}
	if err := json.Unmarshal(b, &info); code != 201 || err != nil || info.ID == "" || info.Pid <= 0 {
		t.Fatalf("create: %d %s", code, b)
	}
	f, err := os.Open(hostile)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if code, b := do("PUT", "/v1/sandboxes/"+info.ID+"/files/workspace/hostile?mode=755", f); code != 204 {
		t.Fatalf("put hostile: %d %s", code, b)
	}
	return info.ID, info.Pid
}

// execAPI runs argv in sandbox id through the API: status, exit code, stdout.
func execAPI(t *testing.T, do apiDo, id string, argv ...string) (int, int, string, []byte) {
	t.Helper()
	a, _ := json.Marshal(map[string]any{"argv": argv})
	code, b := do("POST", "/v1/sandboxes/"+id+"/exec", strings.NewReader(string(a)))
	var res struct {
		ExitCode int `json:"exit_code"`
		Stdout   string
	}
	_ = json.Unmarshal(b, &res)
	return code, res.ExitCode, strings.TrimSpace(res.Stdout), b
}

// TestInitUntouchable is THREATS A13: the command signals its init with
// every signal 0..64 (kill), the fatal ones at each of its threads
// (tgkill), by pidfd and by sigqueue, and as its SIGIO owner; it lowers
// its limits, priority, scheduling class, I/O priority and CPUs, on pid 1
// and on each thread id, and attaches to it (ptrace, /proc/1/mem). The init runs as a uid of its own, so the kernel
// refuses every one with EPERM; a later exec in the same sandbox runs, and
// the init's nice value is unchanged after the command reniced its own uid.
func TestInitUntouchable(t *testing.T) {
	need(t)
	st := stateDir(t)
	do := serveAPI(t, st, fmt.Sprintf("gateway: %s\n", filepath.Join(st, "gw.sock")))
	id, _ := createWithHostile(t, do, `{"agent":"a13"}`)
	sig := "kill=EPERM"
	for _, s := range []int{11, 6, 5, 31, 7, 8, 4, 15} {
		sig += fmt.Sprintf(" tgkill%d=EPERM", s)
	}
	sig += " pidfd_send_signal=EPERM rt_sigqueueinfo=EPERM sigio=written"
	for _, tc := range []struct{ name, arg, want string }{
		{"every signal 0..64 and SEGV, ABRT, TRAP, SYS, BUS, FPE, ILL, TERM to each init thread", "signal-init", sig},
		{"prlimit, setpriority, sched_setaffinity, sched_setscheduler, ioprio_set on pid 1 and each init thread; ptrace and /proc/1/mem", "limit-init",
			"prlimit=EPERM prlimit_cpu=EPERM setpriority=EPERM prio_pgrp=EPERM sched_setaffinity=EPERM sched_setscheduler=EPERM ioprio_set=EPERM prio_user=ok ptrace=EPERM proc_mem=EACCES init_nice=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := casebook.Expect(t, "A13", tc.name+", then exec again in the same sandbox", tc.want+"; then /bin/true exits 0")
			code, _, out, raw := execAPI(t, do, id, "/workspace/hostile", tc.arg)
			code2, exit2, _, raw2 := execAPI(t, do, id, "/bin/true")
			c.Observef("%s; then /bin/true: %d exit %d", out, code2, exit2)
			if code != 200 || out != tc.want {
				t.Errorf("%d %s\nwant %q", code, raw, tc.want)
			}
			if code2 != 200 || exit2 != 0 {
				t.Errorf("the init did not survive: later exec %d %s", code2, raw2)
			}
		})
	}
	if code, b := do("GET", "/v1/sandboxes/"+id, nil); code != 200 || strings.Contains(string(b), `"failed"`) {
		t.Errorf("sandbox after the attempts: %d %s, want it running", code, b)
	}
}

// TestInitDiedReachesGatewayAudit (A13): an init that dies anyway (here
// SIGKILL from the host, which nothing inside a sandbox can send it) marks
// its sandbox failed at once: the API shows why, an exec is 409
// sandbox_failed, sandboxd records init_died, and the gateway's audit log
// has sandbox_init_died for that sandbox, agent and session, reported with
// sandboxd's session token; the chain verifies.
func TestInitDiedReachesGatewayAudit(t *testing.T) {
	need(t)
	st := stateDir(t)
	e, g, cfgPath, tokenFile := reportingGateway(t, "a13", st)
	c := casebook.Expect(t, "A13", "the init of a sandbox dies (SIGKILL from the host), sandboxd reporting to the gateway",
		"GET shows failed; exec 409 sandbox_failed; event init_died; gateway audit sandbox_init_died with the sandbox, agent, session, reported_by session_token[0]; the chain verifies")
	do := serveAPI(t, st, fmt.Sprintf("gateway: %s\nhost: node-a13\ngateway_admin: http://%s\ngateway_session_token_file: %s\n",
		g.Sock, g.Admin, tokenFile), "nsenter", "--net=/run/netns/"+e.NS.Name)
	id, pid := createWithHostile(t, do, `{"agent":"agent-a","session":"s-a13","user":"alice"}`)
	if code, exit, _, b := execAPI(t, do, id, "/bin/true"); code != 200 || exit != 0 {
		t.Fatalf("control: exec before the kill: %d %s", code, b)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	var info []byte
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if _, info = do("GET", "/v1/sandboxes/"+id, nil); strings.Contains(string(info), `"failed"`) {
			break
		}
	}
	if !strings.Contains(string(info), `"failed":"init killed by signal 9 (killed)"`) {
		t.Fatalf("sandbox after its init died: %s, want failed", info)
	}
	code, _, _, b := execAPI(t, do, id, "/bin/true")
	if code != 409 || !strings.Contains(string(b), `"sandbox_failed"`) {
		t.Errorf("exec in the failed sandbox: %d %s, want 409 sandbox_failed", code, b)
	}
	rec := g.AwaitAudit("sandbox_init_died", `"s-a13"`)
	f, _ := rec["fields"].(map[string]any)
	c.Observef("GET %s; exec %d; audit %v %v", info, code, rec["event"], f)
	if f["sandbox"] != id || f["agent"] != "agent-a" || f["session"] != "s-a13" || f["user"] != "alice" ||
		f["host"] != "node-a13" || f["reported_by"] != "session_token[0]" {
		t.Errorf("sandbox_init_died fields %v", f)
	}
	if !hasEvent(events(t, filepath.Join(st, "state")), "init_died") {
		t.Error("no init_died event in sandboxd's events")
	}
	if out, err := e.CLI("", "audit", "verify", "--config", cfgPath); err != nil {
		t.Errorf("sluice audit verify: %v: %s", err, out)
	}
}
