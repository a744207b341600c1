package mcpremote

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync"

	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// maxCredSessions bounds the sessions kept open per remote with
// PerCredential; the oldest is closed to make room.
const maxCredSessions = 64

// credSessions are a remote's sessions by call credential (a hash of the
// header value, never the value): a session is opened with, and only ever
// carries, the one credential it is keyed by.
type credSessions struct {
	mu    sync.Mutex
	by    map[[32]byte]*sdk.ClientSession
	order [][32]byte // oldest first
}

// credSession returns the session of the call's credential (in ctx, from
// its checked request), opening it when there is none. A call without a
// credential has no session: with MCP authorization nothing is sent
// without the person's token.
func (r *Remote) credSession(ctx context.Context) (*sdk.ClientSession, error) {
	ch, ok := ctx.Value(callHeaderKey{}).(callHeader)
	if !ok || ch.value == "" {
		return nil, errors.New("mcpremote: the call carries no credential; nothing was sent")
	}
	k := sha256.Sum256([]byte(ch.name + "\x00" + ch.value))
	c := &r.creds
	c.mu.Lock()
	defer c.mu.Unlock() // opens are serialised per remote: a burst of one person's calls opens one session
	if cs := c.by[k]; cs != nil {
		return cs, nil
	}
	hc := &http.Client{
		Transport:     &fixedCred{r: r, h: ch},
		CheckRedirect: r.hc.CheckRedirect,
	}
	cs, err := r.client.Connect(ctx, &sdk.StreamableClientTransport{Endpoint: r.opts.URL.String(), HTTPClient: hc, MaxRetries: -1}, nil)
	if err != nil {
		return nil, fmt.Errorf("connect: %s", shortErr(err))
	}
	if c.by == nil {
		c.by = map[[32]byte]*sdk.ClientSession{}
	}
	if len(c.order) >= maxCredSessions {
		old := c.order[0]
		c.order = c.order[1:]
		if s := c.by[old]; s != nil {
			delete(c.by, old)
			go s.Close()
		}
	}
	c.by[k] = cs
	c.order = append(c.order, k)
	go func() {
		// A session the remote ended is dropped; the next call reopens.
		_ = cs.Wait()
		c.drop(cs)
	}()
	return cs, nil
}

// drop forgets cs.
func (c *credSessions) drop(cs *sdk.ClientSession) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, s := range c.by {
		if s == cs {
			delete(c.by, k)
			for i, o := range c.order {
				if o == k {
					c.order = append(c.order[:i:i], c.order[i+1:]...)
					break
				}
			}
			return
		}
	}
}

func (c *credSessions) closeAll() {
	c.mu.Lock()
	by := c.by
	c.by, c.order = nil, nil
	c.mu.Unlock()
	for _, s := range by {
		_ = s.Close()
	}
}

// fixedCred sends every request of one session with that session's
// credential, whatever context the SDK sends it in (its standalone
// stream, a notification), through the connector's guarded transport.
type fixedCred struct {
	r *Remote
	h callHeader
}

func (t *fixedCred) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := context.WithValue(req.Context(), callHeaderKey{}, t.h)
	return (&credTransport{r: t.r}).RoundTrip(req.WithContext(ctx))
}

// Transport is the connector's guarded transport (what the remote's OAuth
// client reaches the authorization server through).
func (r *Remote) Transport() http.RoundTripper { return r.opts.Transport }

// listingHeader is the one credential header of a listing's headers.
func listingHeader(h http.Header) (callHeader, bool) {
	if len(h) != 1 {
		return callHeader{}, false
	}
	for k, vs := range h {
		if len(vs) == 1 && vs[0] != "" {
			return callHeader{name: k, value: vs[0]}, true
		}
	}
	return callHeader{}, false
}
