// Package buildinfo says which build a sluice binary is: the module version
// and the VCS commit from runtime/debug.ReadBuildInfo, for `--version` and
// the start-up log line of `sluice serve` and `sandboxd serve`. It imports
// only the standard library, so every command may link it.
package buildinfo

import "runtime/debug"

// Version returns the module version ("(devel)" for a build from a
// checkout) and the commit the binary was built from, "+modified" when the
// tree had uncommitted changes; either is "unknown" when the build info
// lacks it (-buildvcs=false, or a git worktree, which the go command does
// not stamp).
func Version() (version, commit string) {
	version, commit = "unknown", "unknown"
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return version, commit
	}
	if bi.Main.Version != "" {
		version = bi.Main.Version
	}
	var modified bool
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			commit = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if modified {
		commit += "+modified"
	}
	return version, commit
}
