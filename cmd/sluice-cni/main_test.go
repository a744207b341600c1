package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestParseConf: the plugin's own keys are checked and named; an empty
// selection is an error rather than a plugin that silently pins nothing.
func TestParseConf(t *testing.T) {
	cases := []struct {
		name, conf, wantErr string
	}{
		{"namespaces", `{"cniVersion":"1.1.0","type":"sluice-cni","select":{"namespaces":["a"]}}`, ""},
		{"annotation", `{"type":"sluice-cni","sandboxd":"/run/s.sock","select":{"annotation":"sluice-gw.dev/pin"},"timeout":"5s"}`, ""},
		{"no selection", `{"type":"sluice-cni"}`, "select: set all, namespaces or annotation"},
		{"relative socket", `{"type":"sluice-cni","sandboxd":"s.sock","select":{"all":true}}`, `sandboxd: must be an absolute path, got "s.sock"`},
		{"bad timeout", `{"type":"sluice-cni","select":{"all":true},"timeout":"soon"}`, `timeout: must be a positive duration, got "soon"`},
		{"not JSON", `{`, "sluice-cni: config:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConf([]byte(tc.conf))
			if tc.wantErr == "" {
				if err != nil || c.Sandboxd == "" {
					t.Fatalf("got %v, %+v", err, c)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("got %v, want an error containing %q", err, tc.wantErr)
			}
		})
	}
}

// TestSelect: which pods the rule picks from CNI_ARGS and the annotations
// the runtime passes as a capability.
func TestSelect(t *testing.T) {
	const k8s = "IgnoreUnknown=1;K8S_POD_NAMESPACE=team-a;K8S_POD_NAME=p;K8S_POD_UID=u1"
	cases := []struct {
		name, conf, args string
		want             bool
		wantErr          string
	}{
		{"namespace listed", `{"select":{"namespaces":["team-a"]}}`, k8s, true, ""},
		{"namespace not listed", `{"select":{"namespaces":["team-b"]}}`, k8s, false, ""},
		{"annotation true", `{"select":{"annotation":"pin"},"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"pin":"true"}}}`, k8s, true, ""},
		{"annotation other value", `{"select":{"annotation":"pin"},"runtimeConfig":{"io.kubernetes.cri.pod-annotations":{"pin":"yes"}}}`, k8s, false, ""},
		{"annotation absent", `{"select":{"annotation":"pin"}}`, k8s, false, ""},
		{"all", `{"select":{"all":true}}`, k8s, true, ""},
		{"not a pod, not all", `{"select":{"namespaces":["team-a"]}}`, "", false, ""},
		{"not a pod, all: refused, never passed through", `{"select":{"all":true}}`, "", true, "lacks K8S_POD_NAMESPACE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := parseConf([]byte(tc.conf))
			if err != nil {
				t.Fatal(err)
			}
			p, sel, err := podOf(c, tc.args)
			if sel != tc.want {
				t.Errorf("selected %v, want %v", sel, tc.want)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("got %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if sel && (p.namespace != "team-a" || p.name != "p" || p.uid != "u1") {
				t.Errorf("pod %+v", p)
			}
		})
	}
}

// TestInstall: the plugin is appended to the first conflist once, a stale
// entry replaced, the binary copied; a conf dir without a conflist and a
// bad entry are errors that say what is wrong, with nothing written.
func TestInstall(t *testing.T) {
	dir := t.TempDir()
	conf, bin := filepath.Join(dir, "net.d"), filepath.Join(dir, "bin")
	for _, d := range []string{conf, bin} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	plugin := `{"sandboxd":"/run/sluice-sandboxd/sandboxd.sock","select":{"annotation":"sluice-gw.dev/pin"},"capabilities":{"io.kubernetes.cri.pod-annotations":true}}`
	args := []string{"--conf-dir", conf, "--bin-dir", bin, "--plugin", plugin}
	var out strings.Builder
	if err := install(args, &out); err == nil || !strings.Contains(err.Error(), "no *.conflist in") {
		t.Fatalf("no conflist: %v", err)
	}
	if _, err := os.Stat(filepath.Join(bin, "sluice-cni")); err != nil {
		t.Fatalf("binary not copied: %v", err)
	}
	first := filepath.Join(conf, "10-bridge.conflist")
	if err := os.WriteFile(first, []byte(`{"cniVersion":"1.1.0","name":"k8s","plugins":[{"type":"bridge"},{"type":"sluice-cni","sandboxd":"/old.sock","select":{"all":true}}]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(conf, "99-other.conflist")
	if err := os.WriteFile(other, []byte(`{"plugins":[]}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		out.Reset()
		if err := install(args, &out); err != nil {
			t.Fatalf("install #%d: %v", i+1, err)
		}
	}
	if !strings.Contains(out.String(), "already chains sluice-cni") {
		t.Errorf("second install: %q, want no change", out.String())
	}
	b, _ := os.ReadFile(first)
	var list struct{ Plugins []map[string]any }
	if err := json.Unmarshal(b, &list); err != nil {
		t.Fatal(err)
	}
	if len(list.Plugins) != 2 || list.Plugins[0]["type"] != "bridge" || list.Plugins[1]["type"] != "sluice-cni" ||
		list.Plugins[1]["sandboxd"] != "/run/sluice-sandboxd/sandboxd.sock" {
		t.Errorf("conflist after install: %s; want bridge then the new sluice-cni entry", b)
	}
	if b, _ := os.ReadFile(other); string(b) != `{"plugins":[]}` {
		t.Errorf("a conflist the runtime does not use was changed: %s", b)
	}
	bad := []string{"--conf-dir", conf, "--bin-dir", bin, "--plugin", `{"select":{}}`}
	if err := install(bad, &out); err == nil || !strings.Contains(err.Error(), "select: set all") {
		t.Errorf("bad entry: %v", err)
	}
}
