package oauth

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"slices"
	"sync"
	"time"
)

// PendingConnect is a connect Begin started and Complete has not yet
// finished. It holds nothing that completes or forges a connect: ID is a
// hash of the state (which only the person's browser and the provider's
// redirect carry), Bind a hash of the browser session, and Verifier the
// PKCE verifier sealed with a key derived from the state. So it may be
// kept in the gateway's store, where any replica's callback finds it.
type PendingConnect struct {
	ID        string
	Connector string
	User      string
	Bind      string
	Verifier  string
	Created   time.Time
	Expires   time.Time
}

// Pending keeps started connects. Put stores p, dropping the person's
// oldest beyond max-1 (a person's started connects are bounded) and any
// expired; Take deletes and returns the one with id, once however many
// callbacks race for it, or returns ErrBadState.
type Pending interface {
	Put(ctx context.Context, p PendingConnect, max int) error
	Take(ctx context.Context, id string) (PendingConnect, error)
}

func stateID(state string) string {
	h := sha256.Sum256([]byte("sluice oauth2 state\x00" + state))
	return hex.EncodeToString(h[:])
}

func bindHash(bind string) string {
	h := sha256.Sum256([]byte("sluice oauth2 session\x00" + bind))
	return hex.EncodeToString(h[:])
}

func verifierAEAD(state string) cipher.AEAD {
	k := sha256.Sum256([]byte("sluice oauth2 verifier key\x00" + state))
	b, err := aes.NewCipher(k[:])
	if err != nil {
		panic("bug(): oauth: AES-256: " + err.Error())
	}
	g, err := cipher.NewGCM(b)
	if err != nil {
		panic("bug(): oauth: GCM: " + err.Error())
	}
	return g
}

// sealVerifier seals the PKCE verifier under the state, bound to the
// state's ID.
func sealVerifier(state, verifier string) string {
	g := verifierAEAD(state)
	nonce := make([]byte, g.NonceSize())
	_, _ = rand.Read(nonce)
	return base64.RawURLEncoding.EncodeToString(g.Seal(nonce, nonce, []byte(verifier), []byte(stateID(state))))
}

func openVerifier(state string, p PendingConnect) (string, error) {
	b, err := base64.RawURLEncoding.DecodeString(p.Verifier)
	g := verifierAEAD(state)
	if err != nil || len(b) < g.NonceSize() {
		return "", errors.New("oauth: sealed verifier unreadable")
	}
	v, err := g.Open(nil, b[:g.NonceSize()], b[g.NonceSize():], []byte(p.ID))
	if err != nil {
		return "", errors.New("oauth: sealed verifier does not open under this state")
	}
	return string(v), nil
}

// memPending keeps started connects in this process.
type memPending struct {
	mu sync.Mutex
	m  map[string]PendingConnect
}

func (mp *memPending) Put(_ context.Context, p PendingConnect, max int) error {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	var mine []PendingConnect
	for id, q := range mp.m {
		switch {
		case !p.Created.Before(q.Expires):
			delete(mp.m, id)
		case q.User == p.User:
			mine = append(mine, q)
		}
	}
	if max > 0 && len(mine) >= max {
		slices.SortFunc(mine, func(a, b PendingConnect) int { return b.Created.Compare(a.Created) })
		for _, q := range mine[max-1:] {
			delete(mp.m, q.ID)
		}
	}
	mp.m[p.ID] = p
	return nil
}

func (mp *memPending) Take(_ context.Context, id string) (PendingConnect, error) {
	mp.mu.Lock()
	defer mp.mu.Unlock()
	p, ok := mp.m[id]
	if !ok {
		return PendingConnect{}, ErrBadState
	}
	delete(mp.m, id)
	return p, nil
}
