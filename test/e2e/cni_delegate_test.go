//go:build linux

package e2e

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// TestCNIDelegateCheck: with sluice-cni chained after bridge, the list's
// CHECK of a pinned pod fails at the bridge step (bridge looks for the
// pod's veth, which the pin removed). With sluice-cni as the interface
// step running bridge itself ("delegate"), the real chain [loopback,
// sluice-cni{delegate: bridge + host-local}] pins the pod (lo only, the
// node address unreachable, the gateway reached as the mapped identity),
// the whole list's CHECK passes (the pin, checked by sandboxd, and the
// address reservation, by host-local's CHECK), DEL twice is fine and
// releases the address, and CHECK after DEL fails.
func TestCNIDelegateCheck(t *testing.T) {
	e := newEnv(t)
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nft (nftables) for the pin's backstop")
	}
	buildSandboxBins(t)
	bin := buildCNIPlugins(t)
	d := mainConfig(e, "cni-delegate")
	g := e.Start(d, e.Write(d))
	dir := sandboxState(t, "sluice-e2e-cni-delegate-")
	cfg, api := filepath.Join(dir, "sandboxd.yaml"), filepath.Join(dir, "api.sock")
	if err := os.WriteFile(cfg, []byte("api: "+api+"\nstate_dir: "+filepath.Join(dir, "state")+"\ngateway: "+g.Sock+
		"\npods:\n  - {namespace: team-a, agent: agent-a, user: alice}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	startSandboxd(t, cfg, api)
	node := gwenv.NewNetNS(t)
	const nodeIP = "10.78.0.1"
	nodeLn := node.Listen(t, "0.0.0.0:8080")
	t.Cleanup(func() { nodeLn.Close() })
	ipamDir := filepath.Join(dir, "ipam")
	bridge := `{"type":"bridge","bridge":"sluicecni1","isGateway":true,"ipMasq":false,
	  "ipam":{"type":"host-local","dataDir":"` + ipamDir + `","ranges":[[{"subnet":"10.78.0.0/24","gateway":"` + nodeIP + `"}]],"routes":[{"dst":"0.0.0.0/0"}]}}`
	sluiceCNI := `{"type":"sluice-cni","sandboxd":"` + api + `","select":{"namespaces":["team-a"]}`
	delegated, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"pods","plugins":[{"type":"loopback"},` + sluiceCNI + `,"delegate":` + bridge + `}]}`))
	if err != nil {
		t.Fatal(err)
	}
	chained, err := libcni.ConfListFromBytes([]byte(`{"cniVersion":"1.1.0","name":"pods","plugins":[{"type":"loopback"},` + bridge + `,` + sluiceCNI + `}]}`))
	if err != nil {
		t.Fatal(err)
	}
	cni := libcni.NewCNIConfigWithCacheDir([]string{bin}, filepath.Join(dir, "cache"), nodeExec{node: node.Name})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rtFor := func(pod *gwenv.NetNS, id string) *libcni.RuntimeConf {
		return &libcni.RuntimeConf{ContainerID: id, NetNS: "/run/netns/" + pod.Name, IfName: "eth0",
			Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "team-a"}, {"K8S_POD_NAME", id}, {"K8S_POD_UID", "uid-" + id}}}
	}

	// Chained after bridge: the list's CHECK fails at bridge's step.
	old := gwenv.NewNetNS(t)
	oldRT := rtFor(old, "ctr-chained")
	if _, err := cni.AddNetworkList(ctx, chained, oldRT); err != nil {
		t.Fatalf("ADD (chained): %v", err)
	}
	if err := cni.CheckNetworkList(ctx, chained, oldRT); err == nil || !strings.Contains(err.Error(), "eth0") {
		t.Errorf("CHECK of the chained list: %v; want bridge's error about the pod's eth0 (removed by the pin)", err)
	}
	if err := cni.DelNetworkList(ctx, chained, oldRT); err != nil {
		t.Errorf("DEL (chained): %v", err)
	}

	// With the delegate.
	pod := gwenv.NewNetNS(t)
	rt := rtFor(pod, "ctr-d1")
	res, err := cni.AddNetworkList(ctx, delegated, rt)
	if err != nil {
		t.Fatalf("ADD (delegate): %v", err)
	}
	cur, err := current.NewResultFromResult(res)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur.Routes) != 0 || len(cur.IPs) != 1 || !strings.HasPrefix(cur.IPs[0].Address.IP.String(), "10.78.0.") {
		t.Errorf("ADD result: routes %v, ips %v; want bridge's address in 10.78.0.0/24 and no routes", cur.Routes, cur.IPs)
	}
	addr := cur.IPs[0].Address.IP.String()
	if out, err := exec.Command("ip", "-n", pod.Name, "-o", "link", "show").CombinedOutput(); err != nil || strings.Count(strings.TrimSpace(string(out)), "\n") != 0 || !strings.Contains(string(out), " lo:") {
		t.Errorf("links in the pinned pod: %v\n%s; want lo only", err, out)
	}
	if err := dialFrom(pod, nodeIP+":8080"); !errors.Is(err, syscall.ENETUNREACH) {
		t.Errorf("pinned pod dialing the node: %v; want ENETUNREACH", err)
	}
	status, body, err := podCall(pod, "tickets.list_tickets")
	e.Keep([]byte(body))
	if err != nil || status != 200 {
		t.Fatalf("tool call from the pinned pod: %d %v %s", status, err, body)
	}
	line := g.AwaitLog("tool_call from the pod", func(m map[string]any) bool {
		return m["msg"] == "tool_call" && m["session"] == "team-a/ctr-d1/uid-ctr-d1"
	})
	if line["agent"] != "agent-a" || line["user"] != "alice" {
		t.Errorf("decision line %v: want agent-a / alice", line)
	}
	if err := cni.CheckNetworkList(ctx, delegated, rt); err != nil {
		t.Errorf("CHECK of the whole list with the delegate: %v; want it to pass", err)
	}
	reserved := filepath.Join(ipamDir, "pods", addr)
	if _, err := os.Stat(reserved); err != nil {
		t.Errorf("host-local's reservation of %s: %v", addr, err)
	}
	for i := range 2 {
		if err := cni.DelNetworkList(ctx, delegated, rt); err != nil {
			t.Errorf("DEL #%d (delegate): %v", i+1, err)
		}
	}
	if _, err := os.Stat(reserved); !os.IsNotExist(err) {
		t.Errorf("after DEL the address %s is still reserved: %v", addr, err)
	}
	if err := cni.CheckNetworkList(ctx, delegated, rt); err == nil {
		t.Errorf("CHECK after DEL passed; want an error (no pin, no address)")
	}
}
