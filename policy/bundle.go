package policy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/open-policy-agent/opa/v1/ast"
	"github.com/open-policy-agent/opa/v1/bundle"
)

// MaxBundleBytes bounds a bundle as read (compressed) and each of its files
// as unpacked: a bundle is policy, not a data lake, and a gzip bomb from a
// compromised bundle server must not take the gateway down.
const MaxBundleBytes = 64 << 20

// DefaultBundlePoll is how often a bundle URL is polled when poll is unset.
const DefaultBundlePoll = 10 * time.Second

// BundleConfig says where the OPA bundle comes from: a .tar.gz file (watched
// and re-read on change and on Reload) or an HTTP bundle server (polled with
// If-None-Match, so an unchanged bundle costs a 304).
type BundleConfig struct {
	File string
	URL  string
	Poll time.Duration // URL only; 0 = DefaultBundlePoll
	// Verification, when set, requires a .signatures.json whose JWT is
	// signed by Key and whose file hashes match the bundle (OPA's bundle
	// signing format); a bundle without one, or with a bad one, is refused.
	Verification *Verification
	// Client fetches URL (nil: a client with a 30 s timeout and no proxy
	// from the environment).
	Client *http.Client
}

// Verification is the key a signed bundle is checked against.
type Verification struct {
	KeyFile   string // PEM public key (or an HMAC secret for HS256)
	KeyID     string // the key's id in the JWT's kid; "" = "default"
	Scope     string // the scope claim the JWT must carry, if any
	Algorithm string // JWS algorithm; "" = RS256 (as OPA)
}

// opaConfig reads the key file and builds OPA's verification config.
func (v *Verification) opaConfig() (*bundle.VerificationConfig, error) {
	if v == nil {
		return nil, nil
	}
	key, err := os.ReadFile(v.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("policy: bundle verification key: %w", err)
	}
	id := v.KeyID
	if id == "" {
		id = "default"
	}
	alg := v.Algorithm
	if alg == "" {
		alg = "RS256"
	}
	keys := map[string]*bundle.KeyConfig{id: {Key: string(key), Algorithm: alg, Scope: v.Scope}}
	return bundle.NewVerificationConfig(keys, id, v.Scope, nil), nil
}

// Bundle is a loaded, verified OPA bundle: its revision and roots from
// .manifest, its modules (parsed with sluice's capabilities) and its data.
type Bundle struct {
	Revision string
	Roots    []string
	ETag     string
	modules  map[string]*ast.Module
	data     map[string]any
}

// ReadBundle reads a .tar.gz bundle, verifies its signature when v is set
// (a bundle without .signatures.json is then refused), and parses its
// modules as the engine does. The modules still have to compile with the
// rest of the policy: that happens when the engine installs the bundle.
func ReadBundle(r io.Reader, v *Verification) (*Bundle, error) {
	vc, err := v.opaConfig()
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(io.LimitReader(r, MaxBundleBytes+1))
	if err != nil {
		return nil, fmt.Errorf("policy: bundle: read: %w", err)
	}
	if len(raw) > MaxBundleBytes {
		return nil, fmt.Errorf("policy: bundle: larger than %d bytes", MaxBundleBytes)
	}
	b, err := bundle.NewReader(bytes.NewReader(raw)).
		WithBundleVerificationConfig(vc).
		WithRegoVersion(ast.RegoV1).
		WithCapabilities(capabilities()).
		WithSizeLimitBytes(MaxBundleBytes).
		Read()
	if err != nil {
		return nil, fmt.Errorf("policy: bundle: %w", err)
	}
	if b.Type() != bundle.SnapshotBundleType {
		return nil, errors.New("policy: bundle: delta bundles are not supported")
	}
	if len(b.WasmModules) > 0 || len(b.PlanModules) > 0 {
		return nil, errors.New("policy: bundle: wasm and plan modules are not supported: ship Rego")
	}
	out := &Bundle{Revision: b.Manifest.Revision, modules: map[string]*ast.Module{}, data: b.Data}
	if b.Manifest.Roots != nil {
		out.Roots = append(out.Roots, *b.Manifest.Roots...)
	}
	if out.data == nil {
		out.data = map[string]any{}
	}
	if _, ok := out.data["sluice"]; ok {
		return nil, errors.New("policy: bundle: data.sluice is reserved for sluice's library and configuration")
	}
	var problems []Problem
	for _, m := range b.Modules {
		name := "bundle:" + strings.TrimPrefix(m.Path, "/")
		if strings.HasSuffix(name, "_test.rego") {
			continue
		}
		mod, err := ast.ParseModuleWithOpts(name, string(m.Raw), ast.ParserOptions{
			RegoVersion: ast.RegoV1, ProcessAnnotation: true, Capabilities: capabilities(),
		})
		if err != nil {
			var errs ast.Errors
			if errors.As(err, &errs) {
				for _, e := range errs {
					problems = append(problems, problem(e))
				}
				continue
			}
			problems = append(problems, Problem{File: name, Code: ast.ParseErr, Message: err.Error()})
			continue
		}
		if p, bad := reservedPackage(mod); bad {
			problems = append(problems, p)
			continue
		}
		out.modules[name] = mod
	}
	if len(problems) > 0 {
		return nil, &CompileError{Problems: problems}
	}
	return out, nil
}

// readBundleFile reads the configured bundle file.
func readBundleFile(path string, v *Verification) (*Bundle, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("policy: bundle: %w", err)
	}
	defer f.Close()
	return ReadBundle(f, v)
}

// refusedError is a bundle the server sent that did not load or verify;
// etag is the server's ETag for it.
type refusedError struct {
	err  error
	etag string
}

func (e *refusedError) Error() string { return e.err.Error() }
func (e *refusedError) Unwrap() error { return e.err }

// errNotModified is fetchBundle's answer to a 304.
var errNotModified = errors.New("policy: bundle: not modified")

// fetchBundle GETs the bundle URL with If-None-Match: etag. A 304 is
// errNotModified; any status but 200 is an error naming it (never the body).
func fetchBundle(ctx context.Context, c *http.Client, url, etag string, v *Verification) (*Bundle, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("policy: bundle: %w", err)
	}
	if etag != "" {
		req.Header.Set("If-None-Match", etag)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, fmt.Errorf("policy: bundle: fetch: %w", err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotModified:
		return nil, errNotModified
	default:
		return nil, fmt.Errorf("policy: bundle: fetch %s: status %d", url, resp.StatusCode)
	}
	b, err := ReadBundle(resp.Body, v)
	if err != nil {
		return nil, &refusedError{err: err, etag: resp.Header.Get("ETag")}
	}
	b.ETag = resp.Header.Get("ETag")
	return b, nil
}

func (bc *BundleConfig) client() *http.Client {
	if bc.Client != nil {
		return bc.Client
	}
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{Proxy: nil}}
}

// loadBundle loads the configured bundle for a (re)load: the file is read
// again; a URL is fetched only when no bundle is in force yet (polling
// fetches the later revisions).
func (e *Engine) loadBundle(ctx context.Context) (*Bundle, error) {
	bc := e.cfg.Bundle
	switch {
	case bc == nil:
		return nil, nil
	case bc.File != "":
		return readBundleFile(bc.File, bc.Verification)
	case e.bundle != nil:
		return e.bundle, nil
	}
	return fetchBundle(ctx, bc.client(), bc.URL, "", bc.Verification)
}

// PollBundle polls the bundle URL until ctx ends, installing each new
// revision; a bundle that fails to fetch, verify or compile is logged and
// reported to OnBundle, and the previous policy keeps deciding.
func (e *Engine) PollBundle(ctx context.Context) error {
	if e == nil || e.blockAll != "" || e.cfg.Bundle == nil || e.cfg.Bundle.URL == "" {
		<-ctx.Done()
		return nil
	}
	bc := e.cfg.Bundle
	every := bc.Poll
	if every <= 0 {
		every = DefaultBundlePoll
	}
	c := bc.client()
	t := time.NewTicker(every)
	defer t.Stop()
	// refused is the ETag of the last bundle refused: asked with
	// If-None-Match, an unchanged bad bundle is a 304, not a new error
	// logged and counted at every poll.
	refused := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		e.reloadMu.Lock()
		etag := refused
		if etag == "" && e.bundle != nil {
			etag = e.bundle.ETag
		}
		e.reloadMu.Unlock()
		b, err := fetchBundle(ctx, c, bc.URL, etag, bc.Verification)
		if errors.Is(err, errNotModified) {
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var re *refusedError
			if errors.As(err, &re) {
				refused = re.etag
			}
			e.bundleFailed(err)
			continue
		}
		refused = ""
		if err := e.install(ctx, b); err != nil { // logs and reports its own failure
			refused = b.ETag
		}
	}
}

// bundleFailed logs and reports a bundle that did not load.
func (e *Engine) bundleFailed(err error) {
	e.log.Error("policy: bundle rejected; previous policy keeps serving",
		"revision", e.Revision(), "error", err)
	if e.cfg.OnBundle != nil {
		e.cfg.OnBundle(false, err)
	}
}
