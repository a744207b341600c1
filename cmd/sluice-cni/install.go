package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
)

// install is `sluice-cni install`, what the DaemonSet's install-cni
// container runs: it copies this binary into the node's CNI bin directory
// and appends the plugin to the node's conflist (the first *.conflist in
// the conf directory by name, the one the runtime uses), replacing an
// entry of type sluice-cni a previous version left. Both files are written
// whole (a temporary file renamed over the old), so the runtime never
// reads half of either. It changes nothing when the conflist already ends
// with the same entry.
func install(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("install", flag.ContinueOnError)
	confDir := fs.String("conf-dir", "/host/etc/cni/net.d", "the node's CNI configuration directory")
	binDir := fs.String("bin-dir", "/host/opt/cni/bin", "the node's CNI plugin directory")
	pluginConf := fs.String("plugin", "", "the plugin's entry (JSON object; its type is set to sluice-cni)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	var entry map[string]any
	if err := json.Unmarshal([]byte(*pluginConf), &entry); err != nil {
		return fmt.Errorf("install: --plugin: %w", err)
	}
	entry["type"] = "sluice-cni"
	b, _ := json.Marshal(entry)
	if _, err := parseConf(b); err != nil {
		return fmt.Errorf("install: --plugin: %w", err)
	}
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	if err := copyFile(self, filepath.Join(*binDir, "sluice-cni"), 0o755); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	matches, err := filepath.Glob(filepath.Join(*confDir, "*.conflist"))
	if err != nil || len(matches) == 0 {
		return fmt.Errorf("install: no *.conflist in %s: the node's network plugin writes one; sluice-cni chains after it", *confDir)
	}
	slices.Sort(matches)
	path := matches[0]
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	var list map[string]any
	if err := json.Unmarshal(raw, &list); err != nil {
		return fmt.Errorf("install: %s: %w", path, err)
	}
	plugins, ok := list["plugins"].([]any)
	if !ok {
		return fmt.Errorf("install: %s: plugins: not a list", path)
	}
	kept := plugins[:0:0]
	for _, p := range plugins {
		if m, ok := p.(map[string]any); ok && m["type"] == "sluice-cni" {
			continue
		}
		kept = append(kept, p)
	}
	list["plugins"] = append(kept, entry)
	out, err := json.MarshalIndent(list, "", "  ")
	if err != nil {
		return fmt.Errorf("install: %w", err)
	}
	out = append(out, '\n')
	if string(out) == string(raw) {
		fmt.Fprintf(stdout, "sluice-cni: %s already chains sluice-cni\n", path)
		return nil
	}
	if err := writeFile(path, out, 0o644); err != nil {
		return fmt.Errorf("install: %w", err)
	}
	fmt.Fprintf(stdout, "sluice-cni: chained into %s\n", path)
	return nil
}

func copyFile(from, to string, mode os.FileMode) error {
	b, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return writeFile(to, b, mode)
}

// writeFile writes b to a temporary file beside path and renames it over
// path.
func writeFile(path string, b []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	err = errors.Join(err, f.Chmod(mode), f.Close())
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		_ = os.Remove(f.Name())
	}
	return err
}

// isInstall says whether the command line asks for install rather than a
// CNI call (the runtime passes no arguments and CNI_COMMAND).
func isInstall(args []string) bool {
	return len(args) > 1 && args[1] == "install" && os.Getenv("CNI_COMMAND") == ""
}
