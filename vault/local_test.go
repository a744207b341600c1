package vault

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

func openTest(t *testing.T) (*Local, string, string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "state")
	path, key := filepath.Join(dir, "secrets.json"), filepath.Join(dir, "keys", "secrets.key")
	l, err := OpenLocal(path, key)
	if err != nil {
		t.Fatalf("OpenLocal: %v", err)
	}
	return l, path, key
}

func TestLocalSetGetListDelete(t *testing.T) {
	ctx := context.Background()
	l, path, _ := openTest(t)
	if err := l.Set(ctx, "billing-api-key", ScopeProject, NewSecret([]byte(plain))); err != nil {
		t.Fatalf("Set: %v", err)
	}
	if err := l.Set(ctx, "billing-api-key", ConnectorScope("billing"), NewSecret([]byte("connector-value"))); err != nil {
		t.Fatalf("Set: %v", err)
	}
	got, err := l.Get(ctx, "billing-api-key", ScopeProject)
	if err != nil || string(got.Reveal()) != plain {
		t.Fatalf("Get = %q, %v; want %q", got.Reveal(), err, plain)
	}
	// Overwrite.
	if err := l.Set(ctx, "billing-api-key", ScopeProject, NewSecret([]byte("v2"))); err != nil {
		t.Fatal(err)
	}
	if got, _ := l.Get(ctx, "billing-api-key", ScopeProject); string(got.Reveal()) != "v2" {
		t.Fatalf("Get after overwrite = %q, want v2", got.Reveal())
	}
	list, err := l.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 2 || list[0].Scope != "connector:billing" || list[1].Scope != "project" || list[0].Name != "billing-api-key" || list[0].Updated == "" {
		t.Fatalf("List = %+v", list)
	}
	if _, err := l.Get(ctx, "other", ScopeProject); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get missing: err = %v, want ErrNotFound", err)
	}
	if err := l.Delete(ctx, "billing-api-key", ScopeProject); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := l.Get(ctx, "billing-api-key", ScopeProject); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get after Delete: err = %v, want ErrNotFound", err)
	}
	if err := l.Delete(ctx, "billing-api-key", ScopeProject); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second Delete: err = %v, want ErrNotFound", err)
	}

	for p, want := range map[string]os.FileMode{path: 0o600, filepath.Dir(path): 0o700} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != want {
			t.Errorf("%s mode = %#o, want %#o", p, fi.Mode().Perm(), want)
		}
	}
}

func TestLocalResolve(t *testing.T) {
	ctx := context.Background()
	l, _, _ := openTest(t)
	must(t, l.Set(ctx, "tok", ScopeProject, NewSecret([]byte("project-v"))))
	must(t, l.Set(ctx, "tok", UserScope("alice"), NewSecret([]byte("alice-v"))))
	chain := []Scope{ConnectorScope("gh"), UserScope("alice"), ScopeProject}
	s, sc, err := l.Resolve(ctx, "tok", chain...)
	if err != nil || sc != "user:alice" || string(s.Reveal()) != "alice-v" {
		t.Fatalf("Resolve = %q, %q, %v; want alice-v from user:alice", s.Reveal(), sc, err)
	}
	s, sc, err = l.Resolve(ctx, "tok", ConnectorScope("gh"), UserScope("bob"), ScopeProject)
	if err != nil || sc != ScopeProject || string(s.Reveal()) != "project-v" {
		t.Fatalf("Resolve = %q, %q, %v; want project-v", s.Reveal(), sc, err)
	}
	if _, _, err := l.Resolve(ctx, "nope", chain...); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Resolve missing: %v, want ErrNotFound", err)
	}
	if _, sc, err := l.Resolve(ctx, "tok"); err != nil || sc != ScopeProject {
		t.Fatalf("Resolve without scopes = %q, %v; want project", sc, err)
	}
}

func TestLocalReopenAndSecondProcess(t *testing.T) {
	ctx := context.Background()
	l, path, key := openTest(t)
	must(t, l.Set(ctx, "a", ScopeProject, NewSecret([]byte("one"))))
	// A second handle stands for `sluice secrets set` in another process.
	other, err := OpenLocal(path, key)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if got, err := other.Get(ctx, "a", ScopeProject); err != nil || string(got.Reveal()) != "one" {
		t.Fatalf("reopened Get = %q, %v", got.Reveal(), err)
	}
	// Prime l's cache, then write through the other handle: l must see it.
	if _, err := l.Get(ctx, "a", ScopeProject); err != nil {
		t.Fatal(err)
	}
	must(t, other.Set(ctx, "a", ScopeProject, NewSecret([]byte("two"))))
	must(t, other.Set(ctx, "b", ScopeProject, NewSecret([]byte("bee"))))
	if got, err := l.Get(ctx, "a", ScopeProject); err != nil || string(got.Reveal()) != "two" {
		t.Fatalf("Get after other handle's Set = %q, %v; want two", got.Reveal(), err)
	}
	if list, _ := l.List(ctx); len(list) != 2 {
		t.Fatalf("List after other handle's Set = %+v, want 2 entries", list)
	}
}

func TestLocalFileNeverHoldsPlaintext(t *testing.T) {
	ctx := context.Background()
	l, path, _ := openTest(t)
	must(t, l.Set(ctx, "api", ScopeProject, NewSecret([]byte(plain))))
	dir, _ := os.ReadDir(filepath.Dir(path))
	for _, e := range dir {
		if e.IsDir() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(filepath.Dir(path), e.Name()))
		if err != nil {
			t.Fatal(err)
		}
		for _, enc := range []string{plain, base64.StdEncoding.EncodeToString([]byte(plain)), fmt.Sprintf("%x", plain)} {
			if bytes.Contains(b, []byte(enc)) {
				t.Fatalf("%s contains the plaintext (as %q)", e.Name(), enc)
			}
		}
	}
}

// rewrite edits the store file as an attacker with write access would.
func rewrite(t *testing.T, path string, edit func(sf *storeFile)) {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	var sf storeFile
	must(t, json.Unmarshal(b, &sf))
	edit(&sf)
	b, err = json.Marshal(&sf)
	must(t, err)
	must(t, os.WriteFile(path, b, 0o600))
}

func TestLocalTamper(t *testing.T) {
	ctx := context.Background()
	cases := map[string]func(sf *storeFile){
		"flip a ciphertext bit": func(sf *storeFile) {
			s := sf.Secrets["project/api"]
			s.Ciphertext[0] ^= 1
			sf.Secrets["project/api"] = s
		},
		"change the nonce": func(sf *storeFile) {
			s := sf.Secrets["project/api"]
			s.Nonce[0] ^= 1
			sf.Secrets["project/api"] = s
		},
		// AES-GCM binds scope and name as associated data.
		"swap values between entries": func(sf *storeFile) {
			sf.Secrets["project/api"] = sf.Secrets["project/other"]
		},
		"move a value to another scope": func(sf *storeFile) {
			sf.Secrets["project/api"] = sf.Secrets["user:alice/api"]
		},
	}
	for name, edit := range cases {
		t.Run(name, func(t *testing.T) {
			l, path, _ := openTest(t)
			must(t, l.Set(ctx, "api", ScopeProject, NewSecret([]byte(plain))))
			must(t, l.Set(ctx, "other", ScopeProject, NewSecret([]byte("other-"+plain))))
			must(t, l.Set(ctx, "api", UserScope("alice"), NewSecret([]byte("alice-"+plain))))
			rewrite(t, path, edit)
			s, err := l.Get(ctx, "api", ScopeProject)
			if err == nil {
				t.Fatalf("Get after tampering = %q, want error", s.Reveal())
			}
			if !strings.Contains(err.Error(), "message authentication failed") || strings.Contains(err.Error(), plain) {
				t.Fatalf("Get error = %q, want an authentication failure without the value", err)
			}
		})
	}
}

func TestLocalWrongKey(t *testing.T) {
	ctx := context.Background()
	l, path, key := openTest(t)
	must(t, l.Set(ctx, "api", ScopeProject, NewSecret([]byte(plain))))
	other := filepath.Join(t.TempDir(), "other.key")
	if _, err := OpenLocal(filepath.Join(t.TempDir(), "x.json"), other); err != nil {
		t.Fatal(err)
	}
	_, err := OpenLocal(path, other)
	if err == nil || !strings.Contains(err.Error(), "does not match") {
		t.Fatalf("OpenLocal with another key: err = %v, want key mismatch", err)
	}
	// The original key still works.
	if _, err := OpenLocal(path, key); err != nil {
		t.Fatalf("OpenLocal with the right key: %v", err)
	}
}

func TestLocalKeyFile(t *testing.T) {
	_, _, key := openTest(t)
	fi, err := os.Stat(key)
	must(t, err)
	if fi.Mode().Perm() != 0o600 || fi.Size() != KeySize {
		t.Fatalf("created key: mode %#o size %d, want 0600 and %d", fi.Mode().Perm(), fi.Size(), KeySize)
	}
	if fi, _ := os.Stat(filepath.Dir(key)); fi.Mode().Perm() != 0o700 {
		t.Fatalf("key dir mode %#o, want 0700", fi.Mode().Perm())
	}

	cases := []struct {
		name    string
		content []byte
		perm    os.FileMode
		want    string
	}{
		{"group and world readable", make([]byte, KeySize), 0o644, "broader than 0600"},
		{"group readable", make([]byte, KeySize), 0o640, "broader than 0600"},
		{"too short", make([]byte, 16), 0o600, "holds 16 bytes, want 32"},
		{"too long", make([]byte, 64), 0o600, "holds 33 bytes, want 32"},
		{"empty", nil, 0o600, "holds 0 bytes"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			k := filepath.Join(dir, "k")
			must(t, os.WriteFile(k, tc.content, 0o600))
			must(t, os.Chmod(k, tc.perm))
			_, err := OpenLocal(filepath.Join(dir, "s.json"), k)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("OpenLocal: err = %v, want %q", err, tc.want)
			}
		})
	}
}

func TestLocalRejectsBadInput(t *testing.T) {
	ctx := context.Background()
	l, _, _ := openTest(t)
	ok := NewSecret([]byte("v"))
	cases := []struct {
		name  string
		sname string
		scope Scope
		value Secret
		want  string
	}{
		{"empty name", "", ScopeProject, ok, `invalid secret name ""`},
		{"name with slash", "a/b", ScopeProject, ok, `invalid secret name "a/b"`},
		{"name starting with dot", ".env", ScopeProject, ok, `invalid secret name ".env"`},
		{"name too long", strings.Repeat("a", 129), ScopeProject, ok, "invalid secret name"},
		{"empty scope", "n", "", ok, `invalid scope ""`},
		{"unknown scope", "n", "team:x", ok, `invalid scope "team:x"`},
		{"user without name", "n", "user:", ok, `invalid scope "user:": bad user`},
		{"connector with slash", "n", "connector:a/b", ok, `invalid scope "connector:a/b"`},
		{"PROJECT uppercase", "n", "PROJECT", ok, `invalid scope "PROJECT"`},
		{"empty value", "n", ScopeProject, Secret{}, "empty"},
		{"value with CRLF", "n", ScopeProject, NewSecret([]byte("tok" + plain + "\r\nX-Evil: 1")), "forbidden byte 0x0d"},
		{"value with LF", "n", ScopeProject, NewSecret([]byte(plain + "\n")), "forbidden byte 0x0a"},
		{"value with NUL", "n", ScopeProject, NewSecret([]byte(plain + "\x00")), "forbidden byte 0x00"},
		{"value too large", "n", ScopeProject, NewSecret(bytes.Repeat([]byte("a"), MaxValue+1)), "limit 65536"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := l.Set(ctx, tc.sname, tc.scope, tc.value)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Set: err = %v, want %q", err, tc.want)
			}
			if strings.Contains(err.Error(), plain) {
				t.Fatalf("error %q contains the value", err)
			}
		})
	}
	if list, _ := l.List(ctx); len(list) != 0 {
		t.Fatalf("rejected Sets stored %+v", list)
	}
	// The largest allowed value is accepted.
	must(t, l.Set(ctx, "big", ScopeProject, NewSecret(bytes.Repeat([]byte("a"), MaxValue))))
}

func TestLocalConcurrentSets(t *testing.T) {
	ctx := context.Background()
	l, path, key := openTest(t)
	other, err := OpenLocal(path, key) // two handles: two "processes" contending on the flock
	must(t, err)
	var wg sync.WaitGroup
	errs := make(chan error, 40)
	for i := range 40 {
		h := l
		if i%2 == 1 {
			h = other
		}
		wg.Go(func() {
			errs <- h.Set(ctx, fmt.Sprintf("s%d", i), ScopeProject, NewSecret([]byte(fmt.Sprintf("v%d", i))))
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		must(t, err)
	}
	list, err := l.List(ctx)
	must(t, err)
	if len(list) != 40 {
		t.Fatalf("List has %d entries after 40 concurrent Sets: lost updates", len(list))
	}
	for i := range 40 {
		s, err := l.Get(ctx, fmt.Sprintf("s%d", i), ScopeProject)
		if err != nil || string(s.Reveal()) != fmt.Sprintf("v%d", i) {
			t.Fatalf("Get s%d = %q, %v", i, s.Reveal(), err)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
