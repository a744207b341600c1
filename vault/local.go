package vault

import (
	"bytes"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-gw/sluice/internal/keyfile"
)

// KeySize is the length of the local store's key file: an AES-256 key.
const KeySize = 32

const (
	fileVersion = 1
	// checkName is the AAD of the entry that proves the key matches the
	// file, so a wrong key fails at OpenLocal rather than at the first Get.
	checkName  = "sluice-vault-key-check"
	aadVersion = "sluice-vault-v1"
)

// Local is the embedded secret store: one file of AES-256-GCM sealed values
// whose key lives in a separate 0600 key file created at first start.
//
// Each value is sealed with a fresh random nonce and with its scope and name
// as associated data, so a sealed value moved to another entry fails to open.
// The file is replaced atomically (temp file, fsync, rename, fsync of the
// directory) and writers hold an flock on path+".lock", so a `sluice secrets
// set` in another process never races the gateway. Readers do not lock: they
// see either the old or the new file, and re-read it whenever its identity
// (inode, size, mtime, ctime) changes.
//
// Local is safe for concurrent use.
type Local struct {
	path     string
	lockPath string
	aead     cipher.AEAD
	now      func() time.Time

	mu       sync.Mutex
	cache    *storeFile
	cacheKey fileKey
	// watch reports changes at the store's path (inotify; nil where it
	// is not available): while it reports none since the cache was last
	// checked against the file (checked), a lookup does not stat.
	watch   *storeWatch
	checked bool
}

// storeFile is the on-disk JSON document.
type storeFile struct {
	Version int               `json:"version"`
	Check   *sealed           `json:"check,omitempty"`
	Secrets map[string]sealed `json:"secrets"` // "scope/name" → sealed value
}

type sealed struct {
	Nonce      []byte `json:"nonce"`
	Ciphertext []byte `json:"ciphertext"`
	Updated    string `json:"updated"`
}

// fileKey identifies one version of the store file.
type fileKey struct {
	dev, ino, size, mtime, ctime int64
}

// OpenLocal opens (creating if absent) the store at path with its key at keyPath.
//
// The key file is created with 32 random bytes and mode 0600 if it does not
// exist. An existing key file readable or writable by group or others is
// refused, as is one of the wrong length, and a key that does not open the
// store's check value.
func OpenLocal(path, keyPath string) (*Local, error) {
	for _, p := range []string{path, keyPath} {
		if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
			return nil, fmt.Errorf("vault: open local store: %w", err)
		}
	}
	key, err := loadOrCreateKey(keyPath)
	if err != nil {
		return nil, err
	}
	l, err := newLocal(path, key)
	if err != nil {
		return nil, err
	}

	// Create the file (with its key check) if absent, and verify the key.
	err = l.update(func(sf *storeFile) (bool, error) {
		if sf.Check == nil {
			sf.Check = l.seal([]byte(checkName), checkName)
			return true, nil
		}
		if _, err := l.aead.Open(nil, sf.Check.Nonce, sf.Check.Ciphertext, []byte(checkName)); err != nil {
			return false, fmt.Errorf("vault: open local store: key %s does not match store %s", keyPath, path)
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// OpenLocalExisting opens the store at path with its key at keyPath for
// reading and creates nothing: no directory, key, store or lock file (the
// read-only verbs, `sluice secrets list` and `sluice validate`, must leave
// a fresh directory as they found it). A missing store or key is an error
// that wraps fs.ErrNotExist; a key that does not open the store's check
// value is refused as in OpenLocal.
func OpenLocalExisting(path, keyPath string) (*Local, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("vault: open local store: %w", err)
	}
	key, err := readKey(keyPath)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("vault: open local store %s: key file: %w", path, err)
	}
	if err != nil {
		return nil, err
	}
	l, err := newLocal(path, key)
	if err != nil {
		return nil, err
	}
	sf, err := l.load()
	if err != nil {
		return nil, err
	}
	if sf.Check == nil {
		return nil, fmt.Errorf("vault: open local store: %s has no key check value", path)
	}
	if _, err := l.aead.Open(nil, sf.Check.Nonce, sf.Check.Ciphertext, []byte(checkName)); err != nil {
		return nil, fmt.Errorf("vault: open local store: key %s does not match store %s", keyPath, path)
	}
	return l, nil
}

// newLocal is a store at path sealed with key (AES-256-GCM).
func newLocal(path string, key []byte) (*Local, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, fmt.Errorf("vault: open local store: %w", err)
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, fmt.Errorf("vault: open local store: %w", err)
	}
	l := &Local{path: path, lockPath: path + ".lock", aead: aead, now: time.Now}
	l.watch = watchStore(l, path) // before the first read: no change between goes unseen
	return l, nil
}

func loadOrCreateKey(keyPath string) ([]byte, error) {
	key, err := readKey(keyPath)
	if !errors.Is(err, fs.ErrNotExist) {
		return key, err
	}
	key = make([]byte, KeySize)
	if _, err := rand.Read(key); err != nil {
		return nil, fmt.Errorf("vault: create key: %w", err)
	}
	// Whole or not at all, once: another process may be making or
	// reading it at this moment (internal/keyfile).
	created, err := keyfile.Create(keyPath, key)
	if err != nil {
		return nil, fmt.Errorf("vault: create key: %w", err)
	}
	if !created { // another process created it first
		return readKey(keyPath)
	}
	return key, nil
}

func readKey(keyPath string) ([]byte, error) {
	f, err := os.Open(keyPath)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, err
		}
		return nil, fmt.Errorf("vault: read key: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("vault: read key: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("vault: read key: %s is not a regular file", keyPath)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("vault: read key: %s has permissions %#o, broader than 0600; refusing to use it (chmod 600 it)", keyPath, perm)
	}
	key, err := io.ReadAll(io.LimitReader(f, KeySize+1))
	if err != nil {
		return nil, fmt.Errorf("vault: read key: %w", err)
	}
	if len(key) != KeySize {
		return nil, fmt.Errorf("vault: read key: %s holds %d bytes, want %d", keyPath, len(key), KeySize)
	}
	return key, nil
}

func entryKey(name string, scope Scope) string { return string(scope) + "/" + name }

func aad(name string, scope Scope) []byte {
	return []byte(aadVersion + "\x00" + string(scope) + "\x00" + name)
}

func (l *Local) seal(plain []byte, ad string) *sealed {
	nonce := make([]byte, l.aead.NonceSize())
	if _, err := rand.Read(nonce); err != nil {
		panic("bug(): crypto/rand failed: " + err.Error()) // rand.Read never fails on Linux
	}
	return &sealed{
		Nonce:      nonce,
		Ciphertext: l.aead.Seal(nil, nonce, plain, []byte(ad)),
		Updated:    l.now().UTC().Format(time.RFC3339),
	}
}

func checkArgs(ctx context.Context, name string, scope Scope) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := validateName(name); err != nil {
		return err
	}
	return scope.validate()
}

// Set stores value under (name, scope), replacing any previous value.
func (l *Local) Set(ctx context.Context, name string, scope Scope, value Secret) error {
	if err := checkArgs(ctx, name, scope); err != nil {
		return fmt.Errorf("vault: set: %w", err)
	}
	if err := validateValue(value.b); err != nil {
		return fmt.Errorf("vault: set %s/%s: %w", scope, name, err)
	}
	return l.update(func(sf *storeFile) (bool, error) {
		s := l.seal(value.b, string(aad(name, scope)))
		sf.Secrets[entryKey(name, scope)] = *s
		return true, nil
	})
}

// Get returns the value of (name, scope), or an error wrapping ErrNotFound.
func (l *Local) Get(ctx context.Context, name string, scope Scope) (Secret, error) {
	if err := checkArgs(ctx, name, scope); err != nil {
		return Secret{}, fmt.Errorf("vault: get: %w", err)
	}
	sf, err := l.load()
	if err != nil {
		return Secret{}, err
	}
	return l.open(sf, name, scope)
}

// open decrypts one entry of a loaded store file.
func (l *Local) open(sf *storeFile, name string, scope Scope) (Secret, error) {
	s, ok := sf.Secrets[entryKey(name, scope)]
	if !ok {
		return Secret{}, fmt.Errorf("vault: get %s/%s: %w", scope, name, ErrNotFound)
	}
	plain, err := l.aead.Open(nil, s.Nonce, s.Ciphertext, aad(name, scope))
	if err != nil {
		// The AEAD error says only "message authentication failed".
		return Secret{}, fmt.Errorf("vault: get %s/%s: decrypt (tampered value or wrong key): %w", scope, name, err)
	}
	sec := Secret{b: plain}
	return sec, nil
}

// Resolve tries scopes in order (for example connector:SLUG, user:NAME,
// project) and returns the first value found with its scope. With no scopes
// it looks in the project scope. An error other than ErrNotFound stops the
// search: a tampered entry in a narrow scope never falls back to a broader one.
func (l *Local) Resolve(ctx context.Context, name string, scopes ...Scope) (Secret, Scope, error) {
	if len(scopes) == 0 {
		scopes = []Scope{ScopeProject}
	}
	for _, sc := range scopes {
		if err := checkArgs(ctx, name, sc); err != nil {
			return Secret{}, "", fmt.Errorf("vault: resolve: %w", err)
		}
	}
	sf, err := l.load() // one consistent snapshot for every scope
	if err != nil {
		return Secret{}, "", err
	}
	for _, sc := range scopes {
		if _, ok := sf.Secrets[entryKey(name, sc)]; !ok {
			// Not in this scope: try the next without building the
			// not-found error open would make (a tool call with a
			// project-scope secret looks in two scopes first).
			continue
		}
		s, err := l.open(sf, name, sc)
		if err == nil {
			return s, sc, nil
		}
		if !errors.Is(err, ErrNotFound) {
			return Secret{}, "", err
		}
	}
	return Secret{}, "", fmt.Errorf("vault: resolve %s in %d scopes: %w", name, len(scopes), ErrNotFound)
}

// List returns every entry, sorted by scope then name, without values.
func (l *Local) List(ctx context.Context) ([]Entry, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("vault: list: %w", err)
	}
	sf, err := l.load()
	if err != nil {
		return nil, err
	}
	out := make([]Entry, 0, len(sf.Secrets))
	for k, s := range sf.Secrets {
		i := strings.LastIndexByte(k, '/')
		out = append(out, Entry{Name: k[i+1:], Scope: Scope(k[:i]), Updated: s.Updated})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Scope != out[j].Scope {
			return out[i].Scope < out[j].Scope
		}
		return out[i].Name < out[j].Name
	})
	return out, nil
}

// Delete removes (name, scope), or returns an error wrapping ErrNotFound.
func (l *Local) Delete(ctx context.Context, name string, scope Scope) error {
	if err := checkArgs(ctx, name, scope); err != nil {
		return fmt.Errorf("vault: delete: %w", err)
	}
	return l.update(func(sf *storeFile) (bool, error) {
		k := entryKey(name, scope)
		if _, ok := sf.Secrets[k]; !ok {
			return false, fmt.Errorf("vault: delete %s/%s: %w", scope, name, ErrNotFound)
		}
		delete(sf.Secrets, k)
		return true, nil
	})
}

// load returns the current file contents, re-reading the file when it changed.
func (l *Local) load() (*storeFile, error) {
	if l.watch != nil {
		// The watch's queue is drained under the lock, so a change that
		// finished before this call is either drained here or was by a
		// call that checked the file after it.
		l.mu.Lock()
		defer l.mu.Unlock()
		if l.watch.changed() {
			l.checked = false
		}
		if l.checked && l.cache != nil {
			return l.cache, nil
		}
		sf, err := l.loadLocked(false)
		l.checked = err == nil && sf == l.cache
		return sf, err
	}
	// The common case, an unchanged file, stats outside the lock: every
	// tool call with a local credential comes here, and none should queue
	// behind another's system call. A change after this stat is seen by
	// the next call, as it would be had it come after the lock.
	fi, err := os.Stat(l.path)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err == nil && l.cache != nil && statKey(fi) == l.cacheKey {
		return l.cache, nil
	}
	return l.loadLocked(false)
}

func (l *Local) loadLocked(force bool) (*storeFile, error) {
	// The common case is an unchanged file: one stat, no open.
	if !force && l.cache != nil {
		if fi, err := os.Stat(l.path); err == nil && statKey(fi) == l.cacheKey {
			return l.cache, nil
		}
	}
	f, err := os.Open(l.path)
	if errors.Is(err, fs.ErrNotExist) {
		return &storeFile{Version: fileVersion, Secrets: map[string]sealed{}}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("vault: read store: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("vault: read store: %w", err)
	}
	key := statKey(fi)
	if !force && l.cache != nil && key == l.cacheKey {
		return l.cache, nil
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("vault: read store: %w", err)
	}
	sf := &storeFile{}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(sf); err != nil {
		return nil, fmt.Errorf("vault: read store %s: %w", l.path, err)
	}
	if sf.Version != fileVersion {
		return nil, fmt.Errorf("vault: read store %s: version %d, want %d", l.path, sf.Version, fileVersion)
	}
	if sf.Secrets == nil {
		sf.Secrets = map[string]sealed{}
	}
	l.cache, l.cacheKey = sf, key
	return sf, nil
}

func statKey(fi fs.FileInfo) fileKey {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return fileKey{size: fi.Size(), mtime: fi.ModTime().UnixNano()}
	}
	return fileKey{
		dev: int64(st.Dev), ino: int64(st.Ino), size: st.Size,
		mtime: st.Mtim.Nano(), ctime: st.Ctim.Nano(),
	}
}

// update runs fn on a fresh copy of the file under the process mutex and the
// cross-process flock, and writes the result atomically if fn says so.
func (l *Local) update(fn func(*storeFile) (bool, error)) error {
	l.mu.Lock()
	defer l.mu.Unlock()

	lf, err := os.OpenFile(l.lockPath, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("vault: lock store: %w", err)
	}
	defer lf.Close() // closing releases the flock
	if err := flock(lf, syscall.LOCK_EX); err != nil {
		return fmt.Errorf("vault: lock store: %w", err)
	}

	cur, err := l.loadLocked(true)
	if err != nil {
		return err
	}
	// Work on a copy so a failed write leaves the cache as it was.
	sf := &storeFile{Version: cur.Version, Check: cur.Check, Secrets: make(map[string]sealed, len(cur.Secrets)+1)}
	for k, v := range cur.Secrets {
		sf.Secrets[k] = v
	}
	changed, err := fn(sf)
	if err != nil || !changed {
		return err
	}
	b, err := json.MarshalIndent(sf, "", "  ")
	if err != nil {
		return fmt.Errorf("bug(): vault: encode store: %w", err)
	}
	if err := writeAtomic(l.path, append(b, '\n')); err != nil {
		return fmt.Errorf("vault: write store: %w", err)
	}
	l.cache = nil // re-read (and re-key) on next load
	return nil
}

func flock(f *os.File, how int) error {
	for {
		err := syscall.Flock(int(f.Fd()), how)
		if !errors.Is(err, syscall.EINTR) {
			return err
		}
	}
}

// writeAtomic replaces path with b: nothing is ever half-written.
func writeAtomic(path string, b []byte) error {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*") // mode 0600
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) // no-op after a successful rename
	if err := writeSync(tmp, b); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	return syncDir(dir)
}

// writeSync writes b, fsyncs and closes f.
func writeSync(f *os.File, b []byte) error {
	_, err := f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
