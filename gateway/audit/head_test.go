package audit

import (
	"context"
	"crypto/ed25519"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseHead(t *testing.T) {
	good := "3:" + strings.Repeat("ab", 32)
	if h, err := ParseHead(good); err != nil || h.Seq != 3 || h.String() != good {
		t.Fatalf("ParseHead(%q) = %v, %v", good, h, err)
	}
	for _, bad := range []string{"", "3", "0:" + strings.Repeat("ab", 32), "x:" + strings.Repeat("ab", 32), "3:abc", "3:" + strings.Repeat("AB", 32)} {
		if _, err := ParseHead(bad); err == nil || !strings.Contains(err.Error(), "head") {
			t.Errorf("ParseHead(%q) = %v, want an error naming the head", bad, err)
		}
	}
}

// writeLog writes n records to a new log at path and returns them.
func writeLog(t *testing.T, path string, n int, event string) []Record {
	t.Helper()
	l, err := Open(path)
	must(t, err)
	var out []Record
	for i := range n {
		r := rec(i)
		r.Event = event
		got, err := l.Append(context.Background(), r)
		must(t, err)
		out = append(out, got)
	}
	must(t, l.Close())
	return out
}

// TestCheckHead is THREATS G9 in the writer's package: a log cut at its
// end, or rewritten whole with a recomputed chain (every record's own hash
// and every link right), verifies on its own and is caught against a head
// recorded elsewhere.
func TestCheckHead(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	recs := writeLog(t, path, 5, "decision")
	want := Head{Seq: 5, Hash: recs[4].Hash}

	got, ok, err := CheckHead(path, want)
	if err != nil || !ok || got != want {
		t.Fatalf("intact: CheckHead = %v, %v, %v; want %v", got, ok, err, want)
	}
	if _, ok, err := CheckHead(path, Head{Seq: 2, Hash: recs[1].Hash}); err != nil || !ok {
		t.Fatalf("an earlier head: %v, %v", ok, err)
	}

	// Truncated: the last two records deleted (whole lines: the chain
	// still verifies).
	data, err := os.ReadFile(path)
	must(t, err)
	lines := strings.SplitAfter(string(data), "\n")
	cut := filepath.Join(dir, "cut.log")
	must(t, os.WriteFile(cut, []byte(strings.Join(lines[:3], "")), 0o600))
	verifyFile(t, cut)
	_, _, err = CheckHead(cut, want)
	var he *HeadError
	if !errors.As(err, &he) || !he.Truncated || he.Got.Seq != 3 || he.Got.Hash != recs[2].Hash || !strings.Contains(err.Error(), "truncated") {
		t.Fatalf("truncated: err = %v, want a HeadError naming seq 3 as the file's head", err)
	}
	if !strings.Contains(err.Error(), want.String()) || !strings.Contains(err.Error(), he.Got.String()) {
		t.Errorf("error %q does not name both heads", err)
	}

	// Rewritten with a recomputed chain: same length, other records.
	forged := filepath.Join(dir, "forged.log")
	frecs := writeLog(t, forged, 6, "forged")
	verifyFile(t, forged)
	_, _, err = CheckHead(forged, want)
	if !errors.As(err, &he) || he.Truncated || he.At != frecs[4].Hash || !strings.Contains(err.Error(), "rewritten") {
		t.Fatalf("rewritten: err = %v, want a HeadError with the forged hash at seq 5", err)
	}

	// Empty (deleted and re-created empty by a start): truncated.
	empty := filepath.Join(dir, "empty.log")
	must(t, os.WriteFile(empty, nil, 0o600))
	if _, _, err := CheckHead(empty, want); !errors.As(err, &he) || !he.Truncated {
		t.Fatalf("empty: err = %v, want truncated", err)
	}
	// The record at the head's seq (here also the last) is checked
	// itself: an edit of it is named by its line. (An edit of an earlier
	// record is Verify's to find: CheckHead reads only their seqs.)
	bad := filepath.Join(dir, "bad.log")
	edited := strings.Join(lines[:4], "") + strings.Replace(lines[4], `"allow"`, `"block"`, 1)
	must(t, os.WriteFile(bad, []byte(edited), 0o600))
	var ve *VerifyError
	if _, _, err := CheckHead(bad, want); !errors.As(err, &ve) || ve.Line != 5 || !strings.Contains(ve.Reason, "hash mismatch") {
		t.Fatalf("edited: err = %v, want a VerifyError at line 5", err)
	}
	if _, _, err := CheckHead("/dev/null", want); err == nil || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("a device: err = %v, want it refused as not a regular file", err)
	}
	junk := filepath.Join(dir, "junk.log")
	must(t, os.WriteFile(junk, []byte(lines[0]+"not a record\n"), 0o600))
	if _, _, err := CheckHead(junk, want); !errors.As(err, &ve) || ve.Line != 2 {
		t.Fatalf("junk line: err = %v, want a VerifyError at line 2", err)
	}
}

func TestDurableHead(t *testing.T) {
	l, _ := openTest(t)
	if h := l.Head(); h.Seq != 0 || h.Hash != ZeroHash {
		t.Fatalf("empty log head = %v", h)
	}
	recs := appendN(t, l, 3)
	_, err := l.AppendWritten(context.Background(), rec(9))
	must(t, err)
	h, err := l.DurableHead()
	must(t, err)
	if h.Seq != 4 || h == (Head{Seq: 3, Hash: recs[2].Hash}) {
		t.Fatalf("DurableHead = %v, want seq 4", h)
	}
	must(t, l.Close())
	if _, err := l.DurableHead(); err == nil {
		t.Fatal("DurableHead of a closed log: no error")
	}
}

func TestCheckpoints(t *testing.T) {
	dir := t.TempDir()
	keyPath := filepath.Join(dir, "state", "cp.key")
	if _, err := LoadCheckpointKey(keyPath, false); err == nil {
		t.Fatal("a missing key loaded without create")
	}
	key, err := LoadCheckpointKey(keyPath, true)
	must(t, err)
	if fi, err := os.Stat(keyPath); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v, %v; want mode 0600", fi, err)
	}
	again, err := LoadCheckpointKey(keyPath, true)
	must(t, err)
	if !again.Equal(key) {
		t.Fatal("the key changed when loaded again")
	}
	pub := key.Public().(ed25519.PublicKey)
	path := filepath.Join(dir, "checkpoints.jsonl")
	h1 := Head{Seq: 1, Hash: strings.Repeat("a", 64)}
	h2 := Head{Seq: 7, Hash: strings.Repeat("b", 64)}
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	must(t, AppendCheckpoint(path, NewCheckpoint(key, h1, now)))
	must(t, AppendCheckpoint(path, NewCheckpoint(key, h2, now.Add(time.Minute))))
	newest, n, err := ReadCheckpoints(path, pub)
	if err != nil || n != 2 || newest.Head() != h2 || !newest.Time.Equal(now.Add(time.Minute)) {
		t.Fatalf("ReadCheckpoints = %+v, %d, %v", newest, n, err)
	}

	// Another key's checkpoints, and edited ones, are refused.
	_, other, _ := ed25519.GenerateKey(nil)
	if _, _, err := ReadCheckpoints(path, other.Public().(ed25519.PublicKey)); err == nil || !strings.Contains(err.Error(), "not by the trusted key") {
		t.Fatalf("wrong key: err = %v", err)
	}
	data, err := os.ReadFile(path)
	must(t, err)
	edited := filepath.Join(dir, "edited.jsonl")
	must(t, os.WriteFile(edited, []byte(strings.Replace(string(data), `"seq":7`, `"seq":3`, 1)), 0o600))
	if _, _, err := ReadCheckpoints(edited, pub); err == nil || !strings.Contains(err.Error(), "line 2: signature does not verify") {
		t.Fatalf("edited: err = %v", err)
	}
	forged := filepath.Join(dir, "forged.jsonl")
	must(t, AppendCheckpoint(forged, NewCheckpoint(other, h1, now)))
	if _, _, err := ReadCheckpoints(forged, pub); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("forged with another key: err = %v", err)
	}
	emptyPath := filepath.Join(dir, "empty.jsonl")
	must(t, os.WriteFile(emptyPath, nil, 0o600))
	if _, _, err := ReadCheckpoints(emptyPath, pub); err == nil || !strings.Contains(err.Error(), "no checkpoint") {
		t.Fatalf("empty: err = %v", err)
	}
	// The checkpoints carry the public key, never the seed.
	seed, err := os.ReadFile(keyPath)
	must(t, err)
	if strings.Contains(string(data), strings.TrimSpace(string(seed))) {
		t.Fatal("the checkpoint file holds the signing key's seed")
	}
}

// TestHeadWakesWriter: Head and DurableHead take the writer's lock; an
// Append that finds it taken leaves its record to the holder, so the
// holder must look at what is pending when it lets go. Before it did, an
// Append racing the gateway's once-a-second head loop waited for the
// next Append to come along, or its deadline (a 30s audit_unavailable).
func TestHeadWakesWriter(t *testing.T) {
	l, _ := openTest(t)
	stop := make(chan struct{})
	heads := make(chan struct{})
	go func() {
		defer close(heads)
		for {
			select {
			case <-stop:
				return
			default:
			}
			_ = l.Head()
			_, _ = l.DurableHead()
		}
	}()
	defer func() { close(stop); <-heads }()
	for i := range 300 {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := l.Append(ctx, rec(i))
		cancel()
		if err != nil {
			t.Fatalf("append %d while heads are taken: %v", i, err)
		}
	}
}
