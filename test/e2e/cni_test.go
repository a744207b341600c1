//go:build linux

package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/sluice-gw/sluice/test/internal/casebook"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// cniPluginsVersion is the containernetworking/plugins release whose
// bridge, host-local and loopback the tests chain sluice-cni after.
const cniPluginsVersion = "v1.10.0"

var (
	cniOnce   sync.Once
	cniBinDir string
	cniErr    error
)

// buildCNIPlugins builds the reference plugins from their module at
// cniPluginsVersion (go install with GOBIN, outside this module so its
// go.mod does not constrain theirs) and sluice-cni, into one directory.
func buildCNIPlugins(t *testing.T) string {
	t.Helper()
	cniOnce.Do(func() {
		dir, err := os.MkdirTemp("", "sluice-e2e-cni-bin-")
		if err != nil {
			cniErr = err
			return
		}
		var pkgs []string
		for _, p := range []string{"main/bridge", "ipam/host-local", "main/loopback"} {
			pkgs = append(pkgs, "github.com/containernetworking/plugins/plugins/"+p+"@"+cniPluginsVersion)
		}
		cmd := exec.Command("go", append([]string{"install"}, pkgs...)...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOBIN="+dir, "CGO_ENABLED=0", "GOFLAGS=")
		if out, err := cmd.CombinedOutput(); err != nil {
			cniErr = fmt.Errorf("go install the reference CNI plugins: %w\n%s", err, out)
			return
		}
		_, cniErr = gwenv.BuildStatic(dir, "./cmd/sluice-cni")
		cniBinDir = dir
	})
	if cniErr != nil {
		t.Fatal(cniErr)
	}
	return cniBinDir
}

// nodeExec runs every plugin inside the test's "node" namespace, so the
// bridge, its gateway address and the veths are made there, never in the
// host's namespace.
type nodeExec struct{ node string }

func (x nodeExec) ExecPlugin(ctx context.Context, path string, stdin []byte, environ []string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "nsenter", "--net=/run/netns/"+x.node, "--", path)
	cmd.Env = environ
	cmd.Stdin = bytes.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		var e types.Error
		if json.Unmarshal(out.Bytes(), &e) == nil && e.Code != 0 {
			return nil, &e
		}
		return nil, fmt.Errorf("%s: %w: %s %s", filepath.Base(path), err, out.String(), errb.String())
	}
	return out.Bytes(), nil
}

func (nodeExec) FindInPath(plugin string, paths []string) (string, error) {
	return invoke.FindInPath(plugin, paths)
}

func (nodeExec) Decode(b []byte) (version.PluginInfo, error) {
	return (&version.PluginDecoder{}).Decode(b)
}

// sandboxdProc is one `sandboxd serve`.
type sandboxdProc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
	done   chan struct{}
}

// startSandboxd starts sandboxd serve on cfg and waits for its API socket.
func startSandboxd(t *testing.T, cfg, api string) *sandboxdProc {
	t.Helper()
	_ = os.Remove(api)
	p := &sandboxdProc{cmd: exec.Command(sandboxdBin, "serve", "--config", cfg), stderr: &bytes.Buffer{}, done: make(chan struct{})}
	p.cmd.Stderr = p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() { p.stop() })
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if fi, err := os.Stat(api); err == nil && fi.Mode().Type() == os.ModeSocket {
			return p
		}
		select {
		case <-p.done:
			t.Fatalf("sandboxd serve exited: %s", p.stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxd serve: no API socket at %s: %s", api, p.stderr.String())
		}
	}
}

func (p *sandboxdProc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func (p *sandboxdProc) kill9() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// sandboxdEvents reads state_dir/events.jsonl.
func sandboxdEvents(t *testing.T, state string) []map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(state, "events.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			out = append(out, m)
		}
	}
	return out
}

func countEvents(evs []map[string]any, event, sandbox string) int {
	n := 0
	for _, e := range evs {
		if e["event"] == event && (sandbox == "" || e["sandbox"] == sandbox) {
			n++
		}
	}
	return n
}

// podCall posts a tool call to 127.0.0.1:3128 from inside pod (the
// listener sandboxd opened there) and returns the status and body.
func podCall(pod *gwenv.NetNS, tool string) (int, string, error) {
	var c net.Conn
	if err := pod.Do(func() (err error) {
		c, err = net.DialTimeout("tcp", "127.0.0.1:3128", 5*time.Second)
		return err
	}); err != nil {
		return 0, "", err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	fmt.Fprintf(c, "POST /v1/tools/%s HTTP/1.1\r\nHost: sluice\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}", tool)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String(), nil
}

// dialFrom connects to addr from inside ns; nil when it was accepted.
func dialFrom(ns *gwenv.NetNS, addr string) error {
	return ns.Do(func() error {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err == nil {
			c.Close()
		}
		return err
	})
}

// TestCNIPinsPods drives the real chain — bridge, host-local and loopback
// from containernetworking/plugins, then sluice-cni — with libcni against
// network namespaces the test made: a "node" namespace that holds the
// bridge (and a listener on its gateway address, the host-side target),
// and one namespace per pod. It checks that an unpinned pod reaches the
// node address and a pinned one does not, that the pinned pod's proxy
// port reaches the gateway as the identity sandboxd.yaml maps its
// namespace to, that CHECK catches a reopened namespace, that DEL is
// idempotent, that GC unpins what the runtime no longer has, that a
// sandboxd killed with -9 is replaced by one that re-adopts the pins, and
// that ADD fails (the pod never starts) when sandboxd is down or does not
// map the pod's namespace.
func TestCNIPinsPods(t *testing.T) {
	e := newEnv(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables) for the pin's backstop")
	}
	buildSandboxBins(t)
	bin := buildCNIPlugins(t)
	d := mainConfig(e, "cni")
	g := e.Start(d, e.Write(d))

	dir := sandboxState(t, "sluice-e2e-cni-")
	state := filepath.Join(dir, "state")
	cfg := filepath.Join(dir, "sandboxd.yaml")
	api := filepath.Join(dir, "api.sock")
	if err := os.WriteFile(cfg, []byte("api: "+api+"\nstate_dir: "+state+"\ngateway: "+g.Sock+`
pods:
  - namespace: team-a
    agent: agent-a
    user: alice
`), 0o600); err != nil {
		t.Fatal(err)
	}
	sd := startSandboxd(t, cfg, api)

	// The node: the bridge and its gateway address live here, with a
	// listener that answers whoever reaches it.
	node := gwenv.NewNetNS(t)
	const nodeIP = "10.77.0.1"
	nodeLn := node.Listen(t, "0.0.0.0:8080")
	var accepts sync.WaitGroup
	accepted := make(chan string, 16)
	accepts.Add(1)
	go func() {
		defer accepts.Done()
		for {
			c, err := nodeLn.Accept()
			if err != nil {
				return
			}
			accepted <- c.RemoteAddr().String()
			c.Close()
		}
	}()
	t.Cleanup(func() { nodeLn.Close(); accepts.Wait() })
	drain := func() []string {
		var got []string
		for {
			select {
			case a := <-accepted:
				got = append(got, a)
			default:
				return got
			}
		}
	}

	ipamDir := filepath.Join(dir, "ipam")
	bridge := `{"type":"bridge","bridge":"sluicecni0","isGateway":true,"ipMasq":false,
	  "ipam":{"type":"host-local","dataDir":"` + ipamDir + `","ranges":[[{"subnet":"10.77.0.0/24","gateway":"` + nodeIP + `"}]],"routes":[{"dst":"0.0.0.0/0"}]}}`
	sluiceCNI := `{"type":"sluice-cni","sandboxd":"` + api + `","timeout":"30s",
	  "select":{"namespaces":["team-a","team-unmapped"],"annotation":"sluice-gw.dev/pin"},
	  "capabilities":{"io.kubernetes.cri.pod-annotations":true}}`
	plain, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"pods","plugins":[{"type":"loopback"},` + bridge + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	pinned, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"pods","plugins":[{"type":"loopback"},` + bridge + `,` + sluiceCNI + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	// CHECK of sluice-cni alone: the bridge's own CHECK looks for the
	// pod's veth, which the pin removed.
	checkOnly, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"pods","plugins":[` + sluiceCNI + `]}`))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cache"), nodeExec{node: node.Name})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rtFor := func(pod *gwenv.NetNS, id, ns, name string, ann map[string]string) *libcni.RuntimeConf {
		rt := &libcni.RuntimeConf{ContainerID: id, NetNS: "/run/netns/" + pod.Name, IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", ns}, {"K8S_POD_NAME", name}, {"K8S_POD_UID", "uid-" + id}}}
		if ann != nil {
			rt.CapabilityArgs = map[string]any{"io.kubernetes.cri.pod-annotations": ann}
		}
		return rt
	}

	// Control: a pod the chain does not pin reaches the node address, so
	// the refusal below is the pin's doing, not a missing route.
	free := gwenv.NewNetNS(t)
	freeRT := rtFor(free, "ctr-free", "team-b", "free", nil)
	if _, err := cni.AddNetworkList(ctx, plain, freeRT); err != nil {
		t.Fatalf("ADD without sluice-cni: %v", err)
	}
	if err := dialFrom(free, nodeIP+":8080"); err != nil {
		t.Fatalf("control: an unpinned pod cannot reach %s:8080: %v", nodeIP, err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := drain(); len(got) != 1 {
		t.Fatalf("control: node listener saw %v, want one connection", got)
	}

	// A pod selected by its namespace.
	pod := gwenv.NewNetNS(t)
	rt := rtFor(pod, "ctr-a1", "team-a", "pod-1", nil)
	res, err := cni.AddNetworkList(ctx, pinned, rt)
	if err != nil {
		t.Fatalf("ADD: %v", err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur.Routes) != 0 || len(cur.IPs) == 0 || cur.IPs[0].Gateway != nil {
		t.Errorf("ADD result: routes %v, ips %v; want the bridge's addresses with no routes and no gateway", cur.Routes, cur.IPs)
	}
	out, err := exec.Command("ip", "-n", pod.Name, "-o", "link", "show").CombinedOutput()
	if err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || !strings.Contains(string(out), " lo:") {
		t.Errorf("links in the pinned pod: %v\n%s; want lo only", err, out)
	}
	err = dialFrom(pod, nodeIP+":8080")
	time.Sleep(100 * time.Millisecond)
	seen := drain()
	cb := casebook.Expect(t, "A15", "a pod selected for pinning dials the node address "+nodeIP+":8080 on its bridge after ADD",
		"ENETUNREACH inside the pod, no accept on the node; control: an unpinned pod on the same bridge connects")
	cb.Observef("dial: %v; node accepts %v", err, seen)
	if !errors.Is(err, syscall.ENETUNREACH) || len(seen) != 0 {
		t.Errorf("pinned pod dialing %s:8080: %v, node saw %v; want ENETUNREACH and nothing", nodeIP, err, seen)
	}

	// The pod's proxy port reaches the gateway with the mapped identity.
	status, body, err := podCall(pod, "tickets.list_tickets")
	e.Keep([]byte(body))
	if err != nil || status != 200 {
		t.Fatalf("tool call from the pinned pod: %d %v %s", status, err, body)
	}
	line := g.AwaitLog("tool_call from the pod", func(m map[string]any) bool {
		return m["msg"] == "tool_call" && m["session"] == "team-a/pod-1/uid-ctr-a1"
	})
	pinID, _ := line["sandbox"].(string)
	if line["agent"] != "agent-a" || line["user"] != "alice" || line["decision"] != "allow" || !strings.HasPrefix(pinID, "pin-") {
		t.Errorf("decision line %v: want agent-a / alice from sandboxd.yaml's pods rule, allowed, sandbox pin-…", line)
	}

	// CHECK passes; ADD again (a runtime retry) is the same pin.
	if err := cni.CheckNetworkList(ctx, checkOnly, rt); err != nil {
		t.Errorf("CHECK of a pinned pod: %v", err)
	}
	// ADD repeated for the same container after something put an
	// interface back into the pod (a runtime retrying the chain): the same
	// pin, and the namespace closed again before the answer.
	for _, args := range [][]string{
		{"link", "add", "eth9", "type", "veth", "peer", "name", "eth9p"},
		{"addr", "add", "10.77.0.50/24", "dev", "eth9"},
		{"link", "set", "eth9", "up"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", pod.Name}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", args, err, out)
		}
	}
	cached, err := cni.GetNetworkListCachedResult(pinned, rt)
	if err != nil || cached == nil {
		t.Fatalf("cached result: %v %v", cached, err)
	}
	var prev bytes.Buffer
	_ = cached.PrintTo(&prev)
	retry := strings.TrimSuffix(strings.TrimSpace(sluiceCNI), "}") + `,"cniVersion":"1.1.0","name":"pods","prevResult":` + prev.String() + `}`
	_, err = nodeExec{node.Name}.ExecPlugin(ctx, filepath.Join(bin, "sluice-cni"), []byte(retry), append(os.Environ(),
		"CNI_COMMAND=ADD", "CNI_CONTAINERID=ctr-a1", "CNI_NETNS=/run/netns/"+pod.Name, "CNI_IFNAME=eth0", "CNI_PATH="+bin,
		"CNI_ARGS=IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=pod-1;K8S_POD_UID=uid-ctr-a1"))
	if err != nil {
		t.Errorf("ADD repeated for the same container: %v", err)
	}
	if out, err := exec.Command("ip", "-n", pod.Name, "-o", "link", "show").CombinedOutput(); err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 {
		t.Errorf("links in the pod after a repeated ADD: %v\n%s; want lo only", err, out)
	}
	if n := countEvents(sandboxdEvents(t, state), "pod_resealed", ""); n != 1 {
		t.Errorf("sandboxd events: %d pod_resealed, want 1", n)
	}

	// A pod selected by annotation, in a namespace sandboxd maps.
	pod2 := gwenv.NewNetNS(t)
	rt2 := rtFor(pod2, "ctr-a2", "team-a", "pod-2", map[string]string{"sluice-gw.dev/pin": "true"})
	if _, err := cni.AddNetworkList(ctx, pinned, rt2); err != nil {
		t.Fatalf("ADD of a second pod: %v", err)
	}

	// A16: something with CAP_NET_ADMIN in the pod brings a link up: CHECK
	// fails naming it, and sandboxd records it.
	if out, err := exec.Command("ip", "-n", pod2.Name, "link", "add", "sneaky0", "type", "veth", "peer", "name", "sneaky1").CombinedOutput(); err != nil {
		t.Fatalf("ip link add: %v %s", err, out)
	}
	if out, err := exec.Command("ip", "-n", pod2.Name, "link", "set", "sneaky0", "up").CombinedOutput(); err != nil {
		t.Fatalf("ip link set up: %v %s", err, out)
	}
	err = cni.CheckNetworkList(ctx, checkOnly, rt2)
	var te *types.Error
	cb16 := casebook.Expect(t, "A16", "a pinned pod's namespace is reopened (a link added and brought up inside) and the runtime runs CHECK",
		"CHECK fails with CNI code 100 naming the link; sandboxd event pod_check_failed")
	cb16.Observef("CHECK: %v; pod_check_failed events %d", err, countEvents(sandboxdEvents(t, state), "pod_check_failed", ""))
	if !errors.As(err, &te) || te.Code != 100 || !strings.Contains(te.Details, "link sneaky0 is up") {
		t.Errorf("CHECK of a reopened pod: %v; want code 100 naming sneaky0", err)
	}
	if countEvents(sandboxdEvents(t, state), "pod_check_failed", "") != 1 {
		t.Errorf("sandboxd events: want one pod_check_failed")
	}
	_ = exec.Command("ip", "-n", pod2.Name, "link", "del", "sneaky0").Run()

	// G18: sandboxd is killed with -9 while pods are pinned; one pod's
	// namespace goes away meanwhile. The new sandboxd re-adopts the live
	// pin with the same id and identity and reports the lost one.
	pod3 := gwenv.NewNetNS(t)
	rt3 := rtFor(pod3, "ctr-a3", "team-a", "pod-3", nil)
	if _, err := cni.AddNetworkList(ctx, pinned, rt3); err != nil {
		t.Fatalf("ADD of a third pod: %v", err)
	}
	sd.kill9()
	if err := dialFrom(pod, "127.0.0.1:3128"); err == nil {
		t.Errorf("the proxy port still answers with sandboxd dead; the test would prove nothing")
	}
	if out, err := exec.Command("ip", "netns", "del", pod3.Name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns del: %v %s", err, out)
	}
	_ = os.MkdirAll("/run/netns", 0o755)
	if f, err := os.Create("/run/netns/" + pod3.Name); err == nil { // so the cleanup's ip netns del finds a file
		f.Close()
	}
	sd = startSandboxd(t, cfg, api)
	status, body, err = podCall(pod, "tickets.list_tickets")
	e.Keep([]byte(body))
	evs := sandboxdEvents(t, state)
	cb18 := casebook.Expect(t, "G18", "sandboxd is killed with SIGKILL while two pods are pinned, one pod's namespace is deleted meanwhile, and a new sandboxd starts",
		"the live pod's pin is re-adopted (pin_readopted, same pin id and identity) and reaches the gateway; the gone one is reported pin_lost; neither namespace was ever open")
	cb18.Observef("call after restart: %d %v; pin_readopted %d, pin_lost %d", status, err,
		countEvents(evs, "pin_readopted", pinID), countEvents(evs, "pin_lost", ""))
	if err != nil || status != 200 {
		t.Fatalf("tool call from the pod after sandboxd restarted: %d %v %s", status, err, body)
	}
	g.AwaitLog("second tool_call from the pod", func(m map[string]any) bool {
		return m["msg"] == "tool_call" && m["session"] == "team-a/pod-1/uid-ctr-a1" && m["request_id"] != line["request_id"]
	})
	var calls int
	for _, m := range g.LogLines() {
		if m["msg"] == "tool_call" && m["session"] == "team-a/pod-1/uid-ctr-a1" {
			calls++
			if m["sandbox"] != pinID || m["agent"] != "agent-a" || m["user"] != "alice" {
				t.Errorf("decision line after restart %v: want the same pin %s, agent-a, alice", m, pinID)
			}
		}
	}
	if calls != 2 {
		t.Errorf("gateway logged %d calls from pod-1, want 2 (before and after the restart)", calls)
	}
	if countEvents(evs, "pin_readopted", pinID) != 1 || countEvents(evs, "pin_readopted", "") != 2 || countEvents(evs, "pin_lost", "") != 1 {
		t.Errorf("events after restart: want pin_readopted for both live pods (pod-1 as %s) and one pin_lost: %v", pinID, evs)
	}
	if err := cni.CheckNetworkList(ctx, checkOnly, rt); err != nil {
		t.Errorf("CHECK after the restart: %v", err)
	}

	// DEL twice is fine; the pin is gone after the first.
	for i := range 2 {
		if err := cni.DelNetworkList(ctx, pinned, rt); err != nil {
			t.Errorf("DEL #%d: %v", i+1, err)
		}
	}
	evs = sandboxdEvents(t, state)
	if countEvents(evs, "unpinned", pinID) != 1 {
		t.Errorf("events after two DELs: want one unpinned for %s", pinID)
	}
	if err := dialFrom(pod, "127.0.0.1:3128"); err == nil {
		t.Errorf("the proxy port answers after DEL")
	}
	if err := cni.CheckNetworkList(ctx, checkOnly, rt); err == nil {
		t.Errorf("CHECK after DEL passed; want an error (no pin)")
	}

	// GC with pod-2 no longer among the runtime's attachments unpins it.
	if err := cni.GCNetworkList(ctx, checkOnly, &libcni.GCArgs{ValidAttachments: []types.GCAttachment{{ContainerID: "ctr-free", IfName: "eth0"}}}); err != nil {
		t.Errorf("GC: %v", err)
	}
	if countEvents(sandboxdEvents(t, state), "unpinned", "") != 2 {
		t.Errorf("GC did not unpin pod-2")
	}

	// A selected pod in a namespace sandboxd.yaml does not map: refused.
	pod4 := gwenv.NewNetNS(t)
	_, err = cni.AddNetworkList(ctx, pinned, rtFor(pod4, "ctr-u1", "team-unmapped", "pod-u", nil))
	unmapped := err
	// A15 too: sandboxd is down, ADD fails, so the pod never starts.
	sd.stop()
	pod5 := gwenv.NewNetNS(t)
	_, err = cni.AddNetworkList(ctx, pinned, rtFor(pod5, "ctr-a5", "team-a", "pod-5", nil))
	cbDown := casebook.Expect(t, "A15", "ADD for a selected pod while sandboxd is stopped, and for a pod in a namespace sandboxd.yaml does not map",
		"ADD fails (CNI code 11 sandboxd unreachable; code 100 with sandboxd's 403 forbidden): the runtime does not start the pod")
	cbDown.Observef("sandboxd down: %v; unmapped: %v", err, unmapped)
	if !errors.As(err, &te) || te.Code != types.ErrTryAgainLater || !strings.Contains(te.Msg, "sandboxd unreachable") {
		t.Errorf("ADD with sandboxd stopped: %v; want CNI error 11, sandboxd unreachable", err)
	}
	if !errors.As(unmapped, &te) || te.Code != 100 || !strings.Contains(te.Details, "403 forbidden") || !strings.Contains(te.Details, `"team-unmapped"`) {
		t.Errorf("ADD in an unmapped namespace: %v; want CNI error 100 with 403 forbidden naming the namespace", unmapped)
	}
	_ = cni.DelNetworkList(ctx, plain, freeRT)
}
