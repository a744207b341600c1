package audit

import (
	"bufio"
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Checkpoint is a signed statement of a log's head at a time, one JSON line
// of a checkpoint file. The gateway appends one at an interval to a file
// that should live on another machine or sink than the log: deleting the
// last records of the log, or rewriting it with a recomputed chain, then
// disagrees with the newest checkpoint. The signature is Ed25519 so that a
// verifier needs only the public key (Key, checked against one it trusts).
type Checkpoint struct {
	Seq  uint64    `json:"seq"`
	Hash string    `json:"hash"`
	Time time.Time `json:"time"`
	Key  string    `json:"key"` // hex Ed25519 public key of the signer
	Sig  string    `json:"sig"` // hex Ed25519 signature of signedBytes
}

// Head is the head the checkpoint states.
func (c Checkpoint) Head() Head { return Head{Seq: c.Seq, Hash: c.Hash} }

func (c Checkpoint) signedBytes() []byte {
	return []byte("sluice-audit-checkpoint-v1\n" + strconv.FormatUint(c.Seq, 10) + "\n" + c.Hash + "\n" +
		c.Time.UTC().Format(time.RFC3339Nano) + "\n")
}

// NewCheckpoint signs h at t with key.
func NewCheckpoint(key ed25519.PrivateKey, h Head, t time.Time) Checkpoint {
	c := Checkpoint{Seq: h.Seq, Hash: h.Hash, Time: t.UTC()}
	if c.Seq == 0 {
		c.Hash = ZeroHash
	}
	c.Key = hex.EncodeToString(key.Public().(ed25519.PublicKey))
	c.Sig = hex.EncodeToString(ed25519.Sign(key, c.signedBytes()))
	return c
}

// Verify checks that c is signed by pub.
func (c Checkpoint) Verify(pub ed25519.PublicKey) error {
	if c.Key != hex.EncodeToString(pub) {
		return fmt.Errorf("signed by key %.16s…, not by the trusted key %.16s…", c.Key, hex.EncodeToString(pub))
	}
	sig, err := hex.DecodeString(c.Sig)
	if err != nil || !ed25519.Verify(pub, c.signedBytes(), sig) {
		return errors.New("signature does not verify (checkpoint edited or forged)")
	}
	return nil
}

// AppendCheckpoint appends c to the checkpoint file at path (created 0600)
// as one line and fsyncs it.
func AppendCheckpoint(path string, c Checkpoint) error {
	line, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("audit: checkpoint: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("audit: checkpoint: %w", err)
	}
	if _, err := f.Write(append(line, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("audit: checkpoint: write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("audit: checkpoint: sync %s: %w", path, err)
	}
	return f.Close()
}

// ReadCheckpoints reads the checkpoint file at path, checks every line's
// signature against pub, and returns the newest (last) checkpoint and how
// many there are. A file without any checkpoint is an error: it proves
// nothing.
func ReadCheckpoints(path string, pub ed25519.PublicKey) (Checkpoint, int, error) {
	f, err := os.Open(path)
	if err != nil {
		return Checkpoint{}, 0, fmt.Errorf("audit: checkpoints: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	var last Checkpoint
	n := 0
	for sc.Scan() {
		var c Checkpoint
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			return Checkpoint{}, n, fmt.Errorf("audit: checkpoints: %s line %d: not a checkpoint: %w", path, n+1, err)
		}
		if err := c.Verify(pub); err != nil {
			return Checkpoint{}, n, fmt.Errorf("audit: checkpoints: %s line %d: %w", path, n+1, err)
		}
		last = c
		n++
	}
	if err := sc.Err(); err != nil {
		return Checkpoint{}, n, fmt.Errorf("audit: checkpoints: read %s: %w", path, err)
	}
	if n == 0 {
		return Checkpoint{}, 0, fmt.Errorf("audit: checkpoints: %s holds no checkpoint", path)
	}
	return last, n, nil
}

// LoadCheckpointKey reads the Ed25519 key at path (its 32-byte seed, hex),
// creating it (0600, in a directory made 0700) when create is set and the
// file does not exist.
func LoadCheckpointKey(path string, create bool) (ed25519.PrivateKey, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && create {
		return createCheckpointKey(path)
	}
	if err != nil {
		return nil, fmt.Errorf("audit: checkpoint key: %w", err)
	}
	seed, err := hex.DecodeString(string(trimNewline(b)))
	if err != nil || len(seed) != ed25519.SeedSize {
		return nil, fmt.Errorf("audit: checkpoint key %s: want %d bytes of hex", path, ed25519.SeedSize)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

func createCheckpointKey(path string) (ed25519.PrivateKey, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("audit: checkpoint key: %w", err)
	}
	seed := make([]byte, ed25519.SeedSize)
	if _, err := rand.Read(seed); err != nil {
		return nil, fmt.Errorf("audit: checkpoint key: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: checkpoint key: %w", err)
	}
	_, err = f.WriteString(hex.EncodeToString(seed) + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(path)
		return nil, fmt.Errorf("audit: checkpoint key: write %s: %w", path, err)
	}
	return ed25519.NewKeyFromSeed(seed), nil
}

// ParsePublicKey reads a hex Ed25519 public key.
func ParsePublicKey(s string) (ed25519.PublicKey, error) {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != ed25519.PublicKeySize {
		return nil, fmt.Errorf("public key: want %d bytes of hex", ed25519.PublicKeySize)
	}
	return ed25519.PublicKey(b), nil
}

func trimNewline(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}
