//go:build linux

package deploy

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/sandboxd"
)

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return string(b)
}

// unit is a systemd unit file: section -> key -> values, in order.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, p string) unit {
	t.Helper()
	u := unit{}
	sec := ""
	sc := bufio.NewScanner(strings.NewReader(readFile(t, p)))
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			sec = l[1 : len(l)-1]
			if u[sec] == nil {
				u[sec] = map[string][]string{}
			}
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok || sec == "" {
				t.Fatalf("%s:%d: not key=value in a section: %q", filepath.Base(p), n, l)
			}
			u[sec][k] = append(u[sec][k], v)
		}
	}
	return u
}

// last is the value systemd uses for a single-valued key.
func (u unit) last(sec, key string) string {
	v := u[sec][key]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

// list joins every assignment of a list-valued key.
func (u unit) list(sec, key string) []string {
	var out []string
	for _, v := range u[sec][key] {
		out = append(out, strings.Fields(v)...)
	}
	return out
}

// binaries builds cmd/sluice and cmd/sandboxd once for the tests that ask
// their --help.
var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
	buildOut  []byte
)

func binaries(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "sluice-deploy-test-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command("go", "build", "-o", buildDir+"/", "./cmd/sluice", "./cmd/sandboxd")
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("go build ./cmd/sluice ./cmd/sandboxd: %v\n%s", buildErr, buildOut)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

var flagRE = regexp.MustCompile(`(?m)^\s+(?:-[A-Za-z], )?(--[a-z][a-z0-9-]*)`)

// helpFlags runs BIN SUB --help and returns the flags it lists (the verb's
// own and the inherited ones). A verb the binary does not have is an error
// (cobra then prints the root's help, whose usage line is not "BIN SUB").
func helpFlags(t *testing.T, bin, sub string) ([]string, error) {
	t.Helper()
	out, err := exec.Command(filepath.Join(binaries(t), bin), sub, "--help").CombinedOutput()
	if err != nil {
		return nil, fmt.Errorf("%s %s --help: %v: %s", bin, sub, err, out)
	}
	if !strings.Contains(string(out), "Usage:\n  "+bin+" "+sub+" ") && !strings.Contains(string(out), "Usage:\n  "+bin+" "+sub+"\n") {
		return nil, fmt.Errorf("%s has no verb %q", bin, sub)
	}
	var flags []string
	for _, m := range flagRE.FindAllStringSubmatch(string(out), -1) {
		flags = append(flags, m[1])
	}
	if !slices.Contains(flags, "--help") {
		return nil, fmt.Errorf("%s %s --help: no flag list found in %q", bin, sub, out)
	}
	return flags, nil
}

// checkArgv checks that argv's binary is one we build, its verb exists and
// every --flag it passes is one that verb accepts. It returns a
// description of the first problem, or "".
func checkArgv(t *testing.T, argv []string) string {
	t.Helper()
	if len(argv) < 2 {
		return "want BINARY VERB [FLAGS], got " + strings.Join(argv, " ")
	}
	bin := path.Base(argv[0])
	if bin != "sluice" && bin != "sandboxd" {
		return "binary " + argv[0] + " is neither sluice nor sandboxd"
	}
	sub := argv[1]
	flags, err := helpFlags(t, bin, sub)
	if err != nil {
		return err.Error()
	}
	for _, a := range argv[2:] {
		if !strings.HasPrefix(a, "--") {
			continue
		}
		name, _, _ := strings.Cut(a, "=")
		if !slices.Contains(flags, name) {
			return bin + " " + sub + " has no flag " + name + " (it has " + strings.Join(flags, " ") + ")"
		}
	}
	return ""
}

// TestCommandsNameRealFlags checks every command line the deploy files
// start a binary with against the built binary's --help: the systemd
// units' ExecStart and the containers' command. A control case with an
// invented flag must be caught.
func TestCommandsNameRealFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("builds both binaries")
	}
	m := loadManifests(t)
	dep, gw := m.workload(t, "Deployment", gatewayName)
	ds, sd := m.workload(t, "DaemonSet", sandboxdName)
	gc := gw.Template.Spec.containerNamed(t, dep.where(), "gateway")
	sc := sd.Template.Spec.containerNamed(t, ds.where(), "sandboxd")
	argv := func(c *container) []string { return append(slices.Clone(c.Command), c.Args...) }
	sluiceUnit := parseUnit(t, filepath.Join(root, "deploy", "systemd", "sluice.service"))
	sandboxdUnit := parseUnit(t, filepath.Join(root, "deploy", "systemd", "sandboxd.service"))
	cases := []struct {
		name    string
		where   string
		argv    []string
		wantBad bool
	}{
		{"sluice.service", "deploy/systemd/sluice.service: ExecStart", strings.Fields(sluiceUnit.last("Service", "ExecStart")), false},
		{"sandboxd.service", "deploy/systemd/sandboxd.service: ExecStart", strings.Fields(sandboxdUnit.last("Service", "ExecStart")), false},
		{"gateway container", dep.where() + ": containers[gateway].command", argv(gc), false},
		{"sandboxd container", ds.where() + ": containers[sandboxd].command", argv(sc), false},
		{"control: invented flag", "(control)", []string{"/usr/local/bin/sluice", "serve", "--config", "x", "--no-such-flag"}, true},
		{"control: invented verb", "(control)", []string{"/usr/local/sbin/sandboxd", "daemon", "--config", "x"}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.wantBad {
				if msg := checkArgv(t, tc.argv); msg == "" {
					t.Errorf("%s: %q passed; the check cannot fail", tc.where, tc.argv)
				} else {
					t.Logf("refused as it should be: %s", msg)
				}
				return
			}
			if msg := checkArgv(t, tc.argv); msg != "" {
				t.Errorf("%s: %s", tc.where, msg)
			}
		})
	}
}

// TestSystemdUnits checks the units against each other and the example
// configs: sandboxd.service starts after sluice.service, keeps the
// hardening out that would break sandboxes, does not share the gateway's
// runtime directory (systemd removes it when the gateway stops), and its
// directories are the ones deploy/sandboxd.yaml names; sandboxd.yaml's
// gateway socket is the one sluice.yaml opens.
func TestSystemdUnits(t *testing.T) {
	const sdFile, gwFile = "deploy/systemd/sandboxd.service", "deploy/systemd/sluice.service"
	su := parseUnit(t, filepath.Join(root, sdFile))
	gu := parseUnit(t, filepath.Join(root, gwFile))
	sdCfg, err := sandboxd.LoadConfig(filepath.Join(root, "deploy", "sandboxd.yaml"))
	if err != nil {
		t.Fatalf("deploy/sandboxd.yaml: %v", err)
	}
	gwCfg, err := config.Load(filepath.Join(root, "deploy", "sluice.yaml"))
	if err != nil {
		t.Fatalf("deploy/sluice.yaml: %v", err)
	}
	forbidden := []string{
		"RestrictNamespaces", "PrivateDevices", "ProtectControlGroups", "ProtectKernelTunables",
		"NoNewPrivileges", "SystemCallFilter", "MemoryDenyWriteExecute", "CapabilityBoundingSet",
		"AmbientCapabilities", "DynamicUser", "PrivateUsers", "ProtectSystem", "PrivateTmp",
	}
	cases := []struct {
		field string
		ok    bool
	}{
		{"[Unit] Wants= names sluice.service", slices.Contains(su.list("Unit", "Wants"), "sluice.service")},
		{"[Unit] After= names sluice.service", slices.Contains(su.list("Unit", "After"), "sluice.service")},
		{"[Service] User= root or unset", su.last("Service", "User") == "" || su.last("Service", "User") == "root"},
		{"[Service] RuntimeDirectory= differs from sluice.service's", !slices.ContainsFunc(su.list("Service", "RuntimeDirectory"), func(d string) bool {
			return slices.Contains(gu.list("Service", "RuntimeDirectory"), d)
		})},
		{"api (deploy/sandboxd.yaml) is in [Service] RuntimeDirectory=", slices.Contains(su.list("Service", "RuntimeDirectory"), strings.TrimPrefix(path.Dir(sdCfg.API), "/run/"))},
		{"state_dir (deploy/sandboxd.yaml) is [Service] StateDirectory=", slices.Contains(su.list("Service", "StateDirectory"), strings.TrimPrefix(sdCfg.StateDir, "/var/lib/"))},
		{"gateway (deploy/sandboxd.yaml) = gateway.sandbox_socket (deploy/sluice.yaml)", sdCfg.Gateway == gwCfg.Gateway.SandboxSocket},
		{"gateway.sandbox_socket is in sluice.service's RuntimeDirectory=", slices.Contains(gu.list("Service", "RuntimeDirectory"), strings.TrimPrefix(path.Dir(gwCfg.Gateway.SandboxSocket), "/run/"))},
		{"gateway.trusted_relay_uids (deploy/sluice.yaml) has sandboxd's uid 0", slices.Contains(gwCfg.Gateway.TrustedRelayUIDs, 0)},
		{"[Service] ExecStart= --config is /etc/sluice/sandboxd.yaml", flagValue(strings.Fields(su.last("Service", "ExecStart")), "--config") == "/etc/sluice/sandboxd.yaml"},
	}
	for _, key := range forbidden {
		cases = append(cases, struct {
			field string
			ok    bool
		}{"[Service] no " + key + "= (it breaks sandboxes)", len(su["Service"][key]) == 0})
	}
	for _, tc := range cases {
		t.Run(tc.field, func(t *testing.T) {
			if !tc.ok {
				t.Errorf("%s: want %s", sdFile, tc.field)
			}
		})
	}
	t.Run("systemd-analyze verify", func(t *testing.T) {
		sa, err := exec.LookPath("systemd-analyze")
		if err != nil {
			t.Skip("no systemd-analyze")
		}
		dir := t.TempDir()
		for _, f := range []string{"sluice.service", "sandboxd.service"} {
			if err := os.WriteFile(filepath.Join(dir, f), []byte(readFile(t, filepath.Join(root, "deploy", "systemd", f))), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		cmd := exec.Command(sa, "verify", "--man=no", "./sluice.service", "./sandboxd.service")
		cmd.Dir = dir
		out, _ := cmd.CombinedOutput()
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			// The binaries are not installed on the test machine.
			if l == "" || strings.Contains(l, "is not executable: No such file or directory") {
				continue
			}
			t.Errorf("deploy/systemd: systemd-analyze verify: %s", l)
		}
	})
}
