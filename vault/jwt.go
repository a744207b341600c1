package vault

import (
	"context"
	"crypto"
	"crypto/ed25519"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// keyEntry is a transit key's public half, cached for CacheTTL.
type keyEntry struct {
	typ     string
	latest  int
	pubs    map[int]crypto.PublicKey
	expires time.Time
}

// idToken is a cached identity token.
type idToken struct {
	tok     Secret
	aud     json.RawMessage // its aud claim, checked on every use
	expires time.Time
}

// jwsAlg maps a transit key type to its JWS algorithm and the transit sign
// parameters that produce exactly that signature.
func jwsAlg(typ string) (alg string, params map[string]any, ok bool) {
	switch typ {
	case "ecdsa-p256":
		return "ES256", map[string]any{"hash_algorithm": "sha2-256", "marshaling_algorithm": "jws"}, true
	case "ecdsa-p384":
		return "ES384", map[string]any{"hash_algorithm": "sha2-384", "marshaling_algorithm": "jws"}, true
	case "ed25519":
		return "EdDSA", map[string]any{}, true
	case "rsa-2048", "rsa-3072", "rsa-4096":
		return "RS256", map[string]any{"hash_algorithm": "sha2-256", "signature_algorithm": "pkcs1v15"}, true
	}
	return "", nil, false
}

// KeyID is the "kid" of a transit key's version in tokens and the JWKS.
func KeyID(key string, version int) string { return key + "-v" + strconv.Itoa(version) }

// transitKey reads a transit key's type and public keys (cached).
func (v *Vault) transitKey(ctx context.Context, key string) (keyEntry, error) {
	v.mu.Lock()
	e, ok := v.keys[key]
	v.mu.Unlock()
	if ok && time.Now().Before(e.expires) {
		return e, nil
	}
	r, err, _ := v.sf.Do("key\x00"+key, func() (any, error) {
		path := v.cfg.TransitMount + "/keys/" + key
		sec, err := v.read(ctx, path)
		if err != nil {
			return nil, err
		}
		if sec == nil {
			return nil, fmt.Errorf("vault: transit key %q: %w", key, ErrNotFound)
		}
		var meta struct {
			Type   string                     `json:"type"`
			Latest int                        `json:"latest_version"`
			Keys   map[string]json.RawMessage `json:"keys"`
		}
		if err := remarshal(sec.Data, &meta); err != nil {
			return nil, fmt.Errorf("vault: transit key %q: %w", key, err)
		}
		if _, _, ok := jwsAlg(meta.Type); !ok {
			return nil, fmt.Errorf("vault: transit key %q has type %q: want ecdsa-p256, ecdsa-p384, ed25519 or rsa-2048/3072/4096", key, meta.Type)
		}
		e := keyEntry{typ: meta.Type, latest: meta.Latest, pubs: map[int]crypto.PublicKey{}, expires: time.Now().Add(v.cfg.CacheTTL)}
		for ver, raw := range meta.Keys {
			n, err := strconv.Atoi(ver)
			if err != nil {
				continue
			}
			var k struct {
				PublicKey string `json:"public_key"`
			}
			if json.Unmarshal(raw, &k) != nil || k.PublicKey == "" {
				continue
			}
			pub, err := parsePublic(meta.Type, k.PublicKey)
			if err != nil {
				return nil, fmt.Errorf("vault: transit key %q version %d: %w", key, n, err)
			}
			e.pubs[n] = pub
		}
		if e.pubs[e.latest] == nil {
			return nil, fmt.Errorf("vault: transit key %q: no public key for version %d", key, e.latest)
		}
		v.mu.Lock()
		v.keys[key] = e
		v.mu.Unlock()
		return e, nil
	})
	if err != nil {
		return keyEntry{}, err
	}
	return r.(keyEntry), nil
}

func parsePublic(typ, s string) (crypto.PublicKey, error) {
	if typ == "ed25519" {
		b, err := base64.StdEncoding.DecodeString(s)
		if err != nil || len(b) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("bad ed25519 public key")
		}
		return ed25519.PublicKey(b), nil
	}
	blk, _ := pem.Decode([]byte(s))
	if blk == nil {
		return nil, fmt.Errorf("public key is not PEM")
	}
	pub, err := x509.ParsePKIXPublicKey(blk.Bytes)
	if err != nil {
		// Older RSA keys may be PKCS #1.
		if rk, err2 := x509.ParsePKCS1PublicKey(blk.Bytes); err2 == nil {
			return rk, nil
		}
		return nil, fmt.Errorf("public key: %w", err)
	}
	return pub, nil
}

func remarshal(in any, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}

// SignJWT returns a JWT carrying claims (plus iat, nbf, exp = now + ttl),
// signed by the transit key's latest version inside Vault: the private key
// never leaves it. The token is a Secret: it authenticates the call.
func (v *Vault) SignJWT(ctx context.Context, key string, claims map[string]any, ttl time.Duration) (Secret, error) {
	ke, err := v.transitKey(ctx, key)
	if err != nil {
		return Secret{}, err
	}
	alg, params, _ := jwsAlg(ke.typ)
	now := time.Now()
	all := make(map[string]any, len(claims)+3)
	for k, val := range claims {
		all[k] = val
	}
	all["iat"] = now.Unix()
	all["nbf"] = now.Unix() - 5
	all["exp"] = now.Add(ttl).Unix()
	hdr, _ := json.Marshal(map[string]string{"alg": alg, "typ": "JWT", "kid": KeyID(key, ke.latest)})
	body, err := json.Marshal(all)
	if err != nil {
		return Secret{}, fmt.Errorf("vault: sign: claims: %w", err)
	}
	input := b64(hdr) + "." + b64(body)
	req := map[string]any{"input": base64.StdEncoding.EncodeToString([]byte(input)), "key_version": ke.latest}
	for k, val := range params {
		req[k] = val
	}
	path := v.cfg.TransitMount + "/sign/" + key
	sec, err := v.write(ctx, path, req)
	if err != nil {
		return Secret{}, err
	}
	sig, _ := sec.Data["signature"].(string)
	raw, ok := strings.CutPrefix(sig, "vault:v"+strconv.Itoa(ke.latest)+":")
	if !ok {
		return Secret{}, fmt.Errorf("vault: %s: unexpected signature format", path)
	}
	var sb []byte
	if params["marshaling_algorithm"] == "jws" {
		sb, err = base64.RawURLEncoding.DecodeString(strings.TrimRight(raw, "="))
	} else {
		sb, err = base64.StdEncoding.DecodeString(raw)
	}
	if err != nil {
		return Secret{}, fmt.Errorf("vault: %s: signature is not base64", path)
	}
	return NewSecret([]byte(input + "." + b64(sb))), nil
}

func b64(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// IdentityToken returns an identity token for the gateway's own entity from
// the OIDC role (cached until shortly before it expires). When audience is
// set the token's aud must equal it: a role minting for another audience is
// a misconfiguration, refused rather than sent.
func (v *Vault) IdentityToken(ctx context.Context, role, audience string) (Secret, error) {
	v.mu.Lock()
	t, ok := v.idTokens[role]
	v.mu.Unlock()
	if ok && time.Now().Add(30*time.Second).Before(t.expires) {
		return t.checkAud(role, audience)
	}
	r, err, _ := v.sf.Do("id\x00"+role, func() (any, error) {
		path := "identity/oidc/token/" + role
		sec, err := v.read(ctx, path)
		if err != nil {
			return nil, err
		}
		if sec == nil {
			return nil, fmt.Errorf("vault: %s: %w", path, ErrNotFound)
		}
		tok, _ := sec.Data["token"].(string)
		parts := strings.Split(tok, ".")
		if len(parts) != 3 {
			return nil, fmt.Errorf("vault: %s: the reply holds no JWT", path)
		}
		pb, err := base64.RawURLEncoding.DecodeString(parts[1])
		var cl struct {
			Aud json.RawMessage `json:"aud"`
			Exp int64           `json:"exp"`
		}
		if err != nil || json.Unmarshal(pb, &cl) != nil || cl.Exp == 0 {
			return nil, fmt.Errorf("vault: %s: unreadable token claims", path)
		}
		t := idToken{tok: NewSecret([]byte(tok)), aud: cl.Aud, expires: time.Unix(cl.Exp, 0)}
		v.mu.Lock()
		v.idTokens[role] = t
		v.mu.Unlock()
		return t, nil
	})
	if err != nil {
		return Secret{}, err
	}
	return r.(idToken).checkAud(role, audience)
}

// checkAud returns the token if its aud holds audience (or none is set).
func (t idToken) checkAud(role, audience string) (Secret, error) {
	if audience != "" && !audienceHas(t.aud, audience) {
		return Secret{}, fmt.Errorf("vault: identity/oidc/token/%s: the token's audience is not %q (set the role's client_id)", role, audience)
	}
	return t.tok, nil
}

func audienceHas(raw json.RawMessage, want string) bool {
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return one == want
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil {
		for _, a := range many {
			if a == want {
				return true
			}
		}
	}
	return false
}

// JWKS returns the public keys that verify the tokens the gateway attaches:
// every version of each named transit key and, when withIdentity is set,
// Vault's identity OIDC keys. Upstreams fetch it from the admin listener.
func (v *Vault) JWKS(ctx context.Context, transitKeys []string, withIdentity bool) ([]byte, error) {
	set := jose.JSONWebKeySet{Keys: []jose.JSONWebKey{}}
	for _, key := range transitKeys {
		ke, err := v.transitKey(ctx, key)
		if err != nil {
			return nil, err
		}
		alg, _, _ := jwsAlg(ke.typ)
		vers := make([]int, 0, len(ke.pubs))
		for n := range ke.pubs {
			vers = append(vers, n)
		}
		sort.Ints(vers)
		for _, n := range vers {
			set.Keys = append(set.Keys, jose.JSONWebKey{Key: ke.pubs[n], KeyID: KeyID(key, n), Algorithm: alg, Use: "sig"})
		}
	}
	if withIdentity {
		// Not a logical secret: the reply is the key set itself.
		const path = "identity/oidc/.well-known/keys"
		resp, err := v.client.Logical().ReadRawWithContext(ctx, path)
		if err != nil {
			return nil, vaultErr("read", path, err)
		}
		defer resp.Body.Close()
		var ids jose.JSONWebKeySet
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&ids); err != nil {
			return nil, fmt.Errorf("vault: %s: %w", path, err)
		}
		set.Keys = append(set.Keys, ids.Keys...)
	}
	return json.Marshal(set)
}
