package runtoken

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func testKey(t *testing.T, b byte) *Key {
	t.Helper()
	k, err := NewKey(bytes.Repeat([]byte{b}, KeySize))
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestMintCheck(t *testing.T) {
	k := testKey(t, 1)
	now := time.Unix(1_800_000_000, 0)
	c := Claims{Sandbox: "e2b-1", Agent: "agent-a", Session: "s1", User: "alice", Issued: now.Unix(), Expires: now.Add(time.Hour).Unix()}
	tok, err := k.Mint(c)
	if err != nil {
		t.Fatal(err)
	}
	got, err := k.Check(string(tok), now.Add(59*time.Minute))
	if err != nil {
		t.Fatalf("Check: %v", err)
	}
	if got.Agent != "agent-a" || got.Session != "s1" || got.User != "alice" || got.Sandbox != "e2b-1" || got.Nonce == "" {
		t.Fatalf("claims %+v", got)
	}
	tok2, _ := k.Mint(c)
	if tok2 == tok {
		t.Fatal("two mints of one identity gave one token: no nonce")
	}

	sig := string(tok)[strings.LastIndexByte(string(tok), '.')+1:]
	payload := strings.TrimSuffix(strings.TrimPrefix(string(tok), prefix), "."+sig)
	flip := []byte(payload)
	// One character changed to another of the base64url alphabet: a bit
	// flip can leave the alphabet ('A'^1 is '@'), which is malformed, not a bad MAC.
	if flip[len(flip)/2] == 'A' {
		flip[len(flip)/2] = 'B'
	} else {
		flip[len(flip)/2] = 'A'
	}
	for _, tc := range []struct {
		name string
		tok  string
		at   time.Time
		want Reason
	}{
		{"expired at its expiry", string(tok), now.Add(time.Hour), Expired},
		{"other key", string(mustMint(t, testKey(t, 2), c)), now, BadMAC},
		{"altered payload", prefix + string(flip) + "." + sig, now, BadMAC},
		{"payload of another token under this one's mac", prefix + strings.Split(strings.TrimPrefix(string(tok2), prefix), ".")[0] + "." + sig, now, BadMAC},
		{"truncated mac", string(tok[:len(tok)-2]), now, Malformed},
		{"no prefix", strings.TrimPrefix(string(tok), prefix), now, Malformed},
		{"empty", "", now, Malformed},
		{"extra part", string(tok) + ".x", now, Malformed},
		{"too long", prefix + strings.Repeat("A", MaxLen), now, Malformed},
		{"basic password junk", "hunter2", now, Malformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := k.Check(tc.tok, tc.at)
			var e *Error
			if !errors.As(err, &e) || e.Reason != tc.want {
				t.Fatalf("Check = %v, want reason %s", err, tc.want)
			}
			if strings.Contains(err.Error(), string(tok)) || (len(tc.tok) > 8 && strings.Contains(err.Error(), tc.tok)) {
				t.Fatalf("error quotes the token: %v", err)
			}
		})
	}
}

func mustMint(t *testing.T, k *Key, c Claims) Token {
	t.Helper()
	tok, err := k.Mint(c)
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

// TestTokenNeverPrints: a Token in a log line or formatted text is
// [redacted].
func TestTokenNeverPrints(t *testing.T) {
	tok := mustMint(t, testKey(t, 3), Claims{Agent: "a", Session: "s", Expires: time.Now().Add(time.Hour).Unix()})
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("minted", "token", tok)
	out := buf.String() + fmt.Sprintf("%v %s %q %+v", tok, tok, tok, struct{ T Token }{tok})
	if strings.Contains(out, string(tok)) || strings.Contains(out, string(tok)[len(prefix):20]) {
		t.Fatalf("token printed: %s", out)
	}
	if !strings.Contains(out, "[redacted]") {
		t.Fatalf("no [redacted] in %s", out)
	}
}

func TestLoadKey(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "sub", "hosted.key")
	if _, err := LoadKey(p, false); err == nil {
		t.Fatal("a missing key without create loaded")
	}
	k1, err := LoadKey(p, true)
	if err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(p)
	if fi.Mode().Perm() != 0o600 {
		t.Fatalf("key mode %v, want 0600", fi.Mode().Perm())
	}
	k2, err := LoadKey(p, true) // the replica's second start: the same key
	if err != nil {
		t.Fatal(err)
	}
	tok := mustMint(t, k1, Claims{Agent: "a", Session: "s", Expires: time.Now().Add(time.Hour).Unix()})
	if _, err := k2.Check(string(tok), time.Now()); err != nil {
		t.Fatalf("a token of the first load fails with the second: %v", err)
	}
	if err := os.Chmod(p, 0o640); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(p, true); err == nil || !strings.Contains(err.Error(), "readable by group or others") {
		t.Fatalf("a group-readable key: %v", err)
	}
	bad := filepath.Join(dir, "bad.key")
	if err := os.WriteFile(bad, []byte("abcd\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadKey(bad, true); err == nil || !strings.Contains(err.Error(), "want 32 bytes of hex") {
		t.Fatalf("a short key: %v", err)
	}
}

// FuzzCheck: no input panics Check or verifies without the key's MAC.
func FuzzCheck(f *testing.F) {
	k, _ := NewKey(bytes.Repeat([]byte{9}, KeySize))
	tok, _ := k.Mint(Claims{Agent: "a", Session: "s", Expires: 4_000_000_000})
	f.Add(string(tok))   // a good token
	f.Add("srt1..")      // empty parts
	f.Add("srt1.e30.AA") // {} with a short mac
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := k.Check(s, time.Unix(1_800_000_000, 0))
		if err == nil && s != string(tok) {
			t.Fatalf("%q verified as %+v", s, c)
		}
	})
}
