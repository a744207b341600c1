package policy

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/fsnotify/fsnotify"
)

// WatchDebounce is how long Watch waits after the last change before it
// reloads, so an editor's write-rename-chmod burst is one reload.
const WatchDebounce = 100 * time.Millisecond

// Watch reloads on file changes under the configured paths (Rego, data
// documents and the bundle file) until ctx ends,
// then returns nil. It watches directories (recursively) and the parent
// directory of each listed file, so editors that replace a file by renaming
// a new one over it are seen. Reload failures are logged and reported to
// OnReload; the previous policy keeps serving and Watch goes on.
func (e *Engine) Watch(ctx context.Context) error {
	if e == nil || e.blockAll != "" {
		return errors.New("policy: watch: engine was not built by New")
	}
	watched := append([]string(nil), e.cfg.Paths...)
	if bc := e.cfg.Bundle; bc != nil && bc.File != "" {
		watched = append(watched, bc.File)
	}
	if len(watched) == 0 {
		<-ctx.Done()
		return nil
	}
	w, err := fsnotify.NewWatcher()
	if err != nil {
		return fmt.Errorf("policy: watch: %w", err)
	}
	defer w.Close()

	files := map[string]bool{} // files listed explicitly in Paths
	dirs := map[string]bool{}  // directories being watched
	addTree := func(root string) error {
		return filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() {
				return nil
			}
			if p != root && strings.HasPrefix(d.Name(), ".") {
				return filepath.SkipDir
			}
			if err := w.Add(p); err != nil {
				return err
			}
			dirs[filepath.Clean(p)] = true
			return nil
		})
	}
	for _, p := range watched {
		fi, err := os.Stat(p)
		if err != nil {
			return fmt.Errorf("policy: watch %s: %w", p, err)
		}
		if fi.IsDir() {
			err = addTree(p)
		} else {
			files[filepath.Clean(p)] = true
			dir := filepath.Dir(p)
			err = w.Add(dir)
			dirs[filepath.Clean(dir)] = true
		}
		if err != nil {
			return fmt.Errorf("policy: watch %s: %w", p, err)
		}
	}

	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case ev, ok := <-w.Events:
			if !ok {
				return errors.New("policy: watch: watcher closed")
			}
			name := filepath.Clean(ev.Name)
			if ev.Op == fsnotify.Chmod {
				continue
			}
			relevant := strings.HasSuffix(name, ".rego") || isDataFile(filepath.Base(name)) || files[name] || dirs[name] ||
				strings.HasPrefix(filepath.Base(name), "..data") // Kubernetes ConfigMap swap
			if ev.Has(fsnotify.Create) {
				if fi, err := os.Stat(name); err == nil && fi.IsDir() && !strings.HasPrefix(fi.Name(), ".") {
					if err := addTree(name); err != nil {
						e.log.Warn("policy: watch new directory", "dir", name, "error", err)
					}
					relevant = true
				}
			}
			if ev.Has(fsnotify.Remove) || ev.Has(fsnotify.Rename) {
				delete(dirs, name)
			}
			if relevant {
				timer.Reset(WatchDebounce)
			}
		case err, ok := <-w.Errors:
			if !ok {
				return errors.New("policy: watch: watcher closed")
			}
			e.log.Warn("policy: watch", "error", err)
		case <-timer.C:
			// Reload logs and reports its own failure; keep watching.
			_ = e.Reload(ctx)
		}
	}
}
