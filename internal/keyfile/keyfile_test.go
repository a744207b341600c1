package keyfile

import (
	"bytes"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestCreateRace: 16 processes' worth of goroutines make one key file at
// once while 16 others read it. Exactly one creates it; every reader
// sees either no file or the whole content of the one that won, never a
// part (a reader of an O_EXCL file caught it empty: "want 32 bytes of
// hex" in CI); no temporary file is left.
func TestCreateRace(t *testing.T) {
	for round := 0; round < 50; round++ {
		dir := t.TempDir()
		path := filepath.Join(dir, "k", "key")
		var wg sync.WaitGroup
		var mu sync.Mutex
		created := 0
		var winners [][]byte
		for i := 0; i < 16; i++ {
			data := bytes.Repeat([]byte{byte('a' + i)}, 4096)
			wg.Add(2)
			go func() {
				defer wg.Done()
				ok, err := Create(path, data)
				if err != nil {
					t.Error(err)
					return
				}
				if ok {
					mu.Lock()
					created++
					winners = append(winners, data)
					mu.Unlock()
				}
			}()
			go func() {
				defer wg.Done()
				b, err := os.ReadFile(path)
				if err == nil && (len(b) != 4096 || !bytes.Equal(b, bytes.Repeat(b[:1], 4096))) {
					t.Errorf("a reader saw %d bytes of a key being written", len(b))
				}
			}()
		}
		wg.Wait()
		if created != 1 {
			t.Fatalf("round %d: %d creators, want 1", round, created)
		}
		b, _ := os.ReadFile(path)
		if !bytes.Equal(b, winners[0]) {
			t.Fatalf("round %d: the file is not the creator's content", round)
		}
		if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
			t.Errorf("mode %v, want 0600", fi.Mode().Perm())
		}
		if ents, _ := os.ReadDir(filepath.Dir(path)); len(ents) != 1 {
			t.Errorf("round %d: %d entries left in the key's directory, want 1", round, len(ents))
		}
	}
}
