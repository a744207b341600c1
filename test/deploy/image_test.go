//go:build linux

package deploy

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/sandboxd/relay"
	"github.com/sluice-gw/sluice/test/internal/gwenv"
)

// engine runs buildah and podman on storage of the test's own: vfs under
// dir (no overlay mounts left behind), runc (crun refuses this host's
// hybrid cgroup layout: "cgroups in hybrid mode not supported, drop all
// controllers from cgroupv2"), cgroupfs and file events (no systemd).
type engine struct {
	t   *testing.T
	dir string
	env []string
}

func newEngine(t *testing.T) *engine {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root: podman runs the image as root-owned containers here")
	}
	for _, b := range []string{"buildah", "podman", "runc"} {
		if _, err := exec.LookPath(b); err != nil {
			t.Fatalf("%s is not installed (test.sh installs it for this test): %v", b, err)
		}
	}
	dir, err := os.MkdirTemp("", "sluice-image-test-")
	if err != nil {
		t.Fatal(err)
	}
	e := &engine{t: t, dir: dir}
	storage := fmt.Sprintf("[storage]\ndriver = \"vfs\"\ngraphroot = %q\nrunroot = %q\n", filepath.Join(dir, "graph"), filepath.Join(dir, "run"))
	// Podman's default RLIMIT_NOFILE/NPROC are above this host's hard
	// limits, and a container may not raise them (no CAP_SYS_RESOURCE).
	engineConf := "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=4096:4096\"]\n[engine]\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\nruntime = \"runc\"\n" +
		fmt.Sprintf("tmp_dir = %q\nvolume_path = %q\nstatic_dir = %q\n", filepath.Join(dir, "tmp"), filepath.Join(dir, "volumes"), filepath.Join(dir, "static"))
	for name, body := range map[string]string{"storage.conf": storage, "containers.conf": engineConf} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	e.env = append(os.Environ(), "CONTAINERS_STORAGE_CONF="+filepath.Join(dir, "storage.conf"),
		"CONTAINERS_CONF="+filepath.Join(dir, "containers.conf"), "TMPDIR="+filepath.Join(dir, "tmp"))
	if err := os.MkdirAll(filepath.Join(dir, "tmp"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(e.close)
	return e
}

// run runs name args under the engine's settings; it returns the combined
// output and the exit code (-1: it did not run).
func (e *engine) run(timeout time.Duration, name string, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = e.env
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return string(out), ee.ExitCode()
		}
		return string(out) + err.Error(), -1
	}
	return string(out), 0
}

func (e *engine) must(timeout time.Duration, name string, args ...string) string {
	e.t.Helper()
	out, code := e.run(timeout, name, args...)
	if code != 0 {
		e.t.Fatalf("%s %s: exit %d\n%s", name, strings.Join(args, " "), code, out)
	}
	return out
}

// close removes every container and image, unmounts what podman left
// under the test's directory and removes it.
func (e *engine) close() {
	e.run(time.Minute, "podman", "rm", "-f", "-a")
	e.run(time.Minute, "podman", "rmi", "-f", "-a")
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	var under []string
	for _, l := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(l); len(f) > 4 && strings.HasPrefix(f[4], e.dir+"/") {
			under = append(under, f[4])
		}
	}
	for i := len(under) - 1; i >= 0; i-- {
		_ = exec.Command("umount", "-l", under[i]).Run()
	}
	if err := os.RemoveAll(e.dir); err != nil {
		e.t.Errorf("remove %s: %v", e.dir, err)
	}
}

// TestGatewayImage builds deploy/Containerfile with deploy/image/build.sh
// (buildah, nothing pulled) and runs it with podman the way
// deploy/kubernetes/31-gateway-deployment.yaml runs it: the Deployment's
// command, user, env and memory limit, a read-only root, no capabilities,
// no privilege escalation, and each volume the Deployment mounts at its
// mountPath filled from the manifests (ConfigMaps' data; the TLS Secret
// with a real certificate; the state and emptyDir volumes empty and the
// fsGroup's). The gateway must answer /healthz and /readyz in the
// container's network namespace, as the kubelet's probes ask, write its
// store and audit log on the state volume, run as the Deployment's user
// with no capability; and `sluice demo` must pass inside the image.
func TestGatewayImage(t *testing.T) {
	e := newEngine(t)
	m := loadManifests(t)
	dep, w := m.workload(t, "Deployment", gatewayName)
	ps := &w.Template.Spec
	c := ps.containerNamed(t, dep.where(), "gateway")
	if ps.SecurityContext.RunAsUser == nil || ps.SecurityContext.FSGroup == nil {
		t.Fatalf("%s: securityContext needs runAsUser and fsGroup", dep.where())
	}
	uid, gid := *ps.SecurityContext.RunAsUser, *ps.SecurityContext.FSGroup
	if len(c.Command) == 0 {
		t.Fatalf("%s: container gateway has no command", dep.where())
	}

	const tag = "localhost/sluice-image-test:1"
	start := time.Now()
	e.must(20*time.Minute, filepath.Join("deploy", "image", "build.sh"), tag)
	t.Logf("build.sh: %v", time.Since(start).Round(time.Second))

	// The image's own settings agree with the Deployment's.
	var img []struct {
		Config struct {
			User       string
			Entrypoint []string
			Cmd        []string
		}
		Size int64
	}
	if err := json.Unmarshal([]byte(e.must(time.Minute, "podman", "image", "inspect", tag)), &img); err != nil || len(img) != 1 {
		t.Fatalf("podman image inspect: %v", err)
	}
	ic := img[0].Config
	if want := fmt.Sprintf("%d:%d", uid, gid); ic.User != want {
		t.Errorf("image USER %q, the Deployment runs as %s (runAsUser:fsGroup)", ic.User, want)
	}
	if len(ic.Entrypoint) != 1 || ic.Entrypoint[0] != c.Command[0] {
		t.Errorf("image ENTRYPOINT %q, the Deployment's command starts %q", ic.Entrypoint, c.Command[0])
	}
	if got, want := append(append([]string{}, ic.Entrypoint...), ic.Cmd...), c.Command; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("image ENTRYPOINT+CMD %q, Deployment command %q: the image run alone should do what the pod does", got, want)
	}
	t.Logf("image: %d MB, user %s", img[0].Size>>20, ic.User)

	// Nothing but the gateway is in it: no shell to exec into.
	if out, code := e.run(time.Minute, "podman", "run", "--rm", "--network", "none",
		"--entrypoint", "/bin/sh", tag, "-c", "true"); code == 0 || !strings.Contains(out, "/bin/sh") {
		t.Errorf("/bin/sh in the image ran (exit %d): %s", code, out)
	}

	// The Deployment's volumes, filled as the cluster would.
	vols := filepath.Join(e.dir, "vols")
	cert, caPEM, _ := gwenv.UpstreamPKI(t, "sluice-gateway.sluice.svc")
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	tlsFiles := map[string][]byte{
		"tls.crt": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}),
		"tls.key": pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}),
		"ca.crt":  caPEM,
	}
	args := []string{"run", "-d", "--name", "gw", "--network", "none", "--read-only", "--read-only-tmpfs=false",
		"--cap-drop=all", "--security-opt", "no-new-privileges",
		"--user", fmt.Sprintf("%d:%d", uid, gid), "--group-add", strconv.FormatInt(gid, 10)}
	if l := c.Resources.Limits["memory"]; l != "" {
		args = append(args, "--memory", strings.TrimSuffix(strings.ToLower(l), "i"))
	}
	for _, ev := range c.Env {
		if ev.ValueFrom == nil {
			args = append(args, "--env", ev.Name+"="+ev.Value)
		}
	}
	var state string
	for _, vm := range c.VolumeMounts {
		v := ps.volume(vm.Name)
		if v == nil {
			t.Fatalf("%s: volumeMount %s names no volume", dep.where(), vm.Name)
		}
		d := filepath.Join(vols, vm.Name)
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
		switch {
		case v.ConfigMap != nil:
			cm := m.get(t, "ConfigMap", v.ConfigMap.Name)
			for k, s := range cm.Data {
				writeOwned(t, filepath.Join(d, k), []byte(s), 0o444, gid)
			}
		case v.Secret != nil:
			s := m.get(t, "Secret", v.Secret.SecretName)
			mode := os.FileMode(0o440)
			if v.Secret.DefaultMode != nil {
				mode = os.FileMode(*v.Secret.DefaultMode)
			}
			for k, val := range s.StringData {
				b := []byte(val)
				if f, ok := tlsFiles[k]; ok && v.Secret.SecretName == "sluice-gateway-tls" {
					b = f
				}
				writeOwned(t, filepath.Join(d, k), b, mode, gid)
			}
		case v.PersistentVolumeClaim != nil, v.EmptyDir != nil:
			if vm.MountPath == "/var/lib/sluice" {
				state = d
			}
		default:
			t.Fatalf("%s: volume %s: a source this test cannot stand in for", dep.where(), v.Name)
		}
		if err := os.Chown(d, -1, int(gid)); err != nil {
			t.Fatal(err)
		}
		if v.PersistentVolumeClaim != nil || v.EmptyDir != nil {
			_ = os.Chmod(d, 0o770)
			if vm.MountPath == "/tmp" {
				_ = os.Chmod(d, 0o1777)
			}
		}
		opt := d + ":" + vm.MountPath
		if vm.ReadOnly {
			opt += ":ro"
		}
		args = append(args, "-v", opt)
	}
	if state == "" {
		t.Fatalf("%s: no volume at /var/lib/sluice (store, audit log)", dep.where())
	}
	ep, _ := json.Marshal(c.Command)
	args = append(args, "--entrypoint", string(ep), tag)
	e.must(2*time.Minute, "podman", args...)
	logs := func() string { out, _ := e.run(time.Minute, "podman", "logs", "gw"); return out }

	var pid int
	for deadline := time.Now().Add(30 * time.Second); pid == 0 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		out, _ := e.run(time.Minute, "podman", "inspect", "-f", "{{.State.Pid}}", "gw")
		pid, _ = strconv.Atoi(strings.TrimSpace(out))
	}
	if pid == 0 {
		t.Fatalf("the container has no process\n%s", logs())
	}
	// The probes: the kubelet's GETs on the admin port, inside the pod's
	// network namespace (the container has no other network).
	port := "8080"
	for _, p := range []*probe{c.LivenessProbe, c.ReadinessProbe} {
		if p != nil && p.HTTPGet != nil {
			if n, ok := containerPort(c, p.HTTPGet.Port); ok {
				port = n
			}
		}
	}
	nsPath := fmt.Sprintf("/proc/%d/ns/net", pid)
	hc := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			var conn net.Conn
			err := relay.InNetNS(nsPath, func() error {
				var err error
				conn, err = net.DialTimeout("tcp", addr, 2*time.Second)
				return err
			})
			return conn, err
		}}}
	get := func(path string) (int, string, error) {
		resp, err := hc.Get("http://127.0.0.1:" + port + path)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return resp.StatusCode, string(b), nil
	}
	var code int
	var body string
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if code, body, err = get("/readyz"); err == nil && code == http.StatusOK {
			break
		}
	}
	if code != http.StatusOK {
		t.Fatalf("/readyz: %d %s %v\n%s", code, body, err, logs())
	}
	if code, body, err = get("/healthz"); err != nil || code != http.StatusOK {
		t.Fatalf("/healthz: %d %s %v", code, body, err)
	}

	// As the Deployment's user, with no capability and no way to gain one.
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"Uid":        fmt.Sprintf("%d\t%d\t%d\t%d", uid, uid, uid, uid),
		"CapEff":     "0000000000000000",
		"CapPrm":     "0000000000000000",
		"CapBnd":     "0000000000000000",
		"NoNewPrivs": "1",
	}
	for _, l := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(l, ":")
		if w, ok := want[k]; ok {
			if strings.TrimSpace(v) != w {
				t.Errorf("/proc/%d/status %s = %q, want %q", pid, k, strings.TrimSpace(v), w)
			}
			delete(want, k)
		}
	}
	if len(want) > 0 {
		t.Errorf("/proc/%d/status lacks %v", pid, want)
	}
	for _, f := range []string{"sluice.db", "audit.log"} {
		if _, err := os.Stat(filepath.Join(state, f)); err != nil {
			t.Errorf("the gateway made no %s on the state volume: %v", f, err)
		}
	}
	// A SIGTERM (podman stop, as the kubelet does) ends it cleanly.
	e.must(time.Minute, "podman", "stop", "-t", "20", "gw")
	if out := strings.TrimSpace(e.must(time.Minute, "podman", "inspect", "-f", "{{.State.ExitCode}}", "gw")); out != "0" {
		t.Errorf("exit code after SIGTERM: %s\n%s", out, logs())
	}

	// The demo, inside the image, as the same user on a read-only root
	// (its temporary directory on a tmpfs, as the Deployment's /tmp).
	out, rc := e.run(5*time.Minute, "podman", "run", "--rm", "--network", "none", "--read-only", "--cap-drop=all",
		"--security-opt", "no-new-privileges", "--user", fmt.Sprintf("%d:%d", uid, gid),
		"--tmpfs", "/tmp:rw,mode=1777", "--entrypoint", `["/usr/local/bin/sluice","demo"]`, tag)
	if rc != 0 || !strings.Contains(out, "demo ok") {
		t.Fatalf("sluice demo in the image: exit %d\n%s", rc, out)
	}
	if i := bytes.LastIndexByte([]byte(strings.TrimSpace(out)), '\n'); i >= 0 {
		t.Logf("demo: %s", strings.TrimSpace(out)[i+1:])
	}
}

// writeOwned writes a mounted file as the cluster would: mode, and the
// pod's fsGroup as its group.
func writeOwned(t *testing.T, p string, b []byte, mode os.FileMode, gid int64) {
	t.Helper()
	if err := os.WriteFile(p, b, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, mode); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(p, 0, int(gid)); err != nil {
		t.Fatal(err)
	}
}
