package ingress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/sandboxd/wire"
)

// Hosted sandboxes. A sandbox on a host without sandboxd (E2B, Daytona,
// Modal) has no relay to vouch for it; it reaches the gateway over TLS
// (gateway.hosted) and names itself with a per-run token the platform
// minted for it, in the first request's Proxy-Authorization (Basic: the
// session as user, the token as password; `HTTPS_PROXY=https://S:TOKEN@host:port`
// makes every HTTP client send it). The listener checks the token (the
// HookCheck the root gives it: MAC, expiry, ended session), and the
// connection then joins the sandbox socket's, served by the same server
// with the same checks and caps as a relayed one: identity is what the
// token named, never a header.
//
// Every later request on the connection must carry the same credential
// (compared in constant time) or it is refused 407 and the connection
// closed, and the connection is closed when the token expires. The
// credential headers are removed before any handler sees a request.

// HostedVerdict is what a HostedCheck found. ID is set whenever the
// token's MAC verified (its claims), even when it is refused for being
// expired or its session ended, so that the refusal can be audited
// under the identity; Refused is "" for an accepted token, else a reason
// word (never the token). Unavailable marks a refusal because the store
// could not be read (answered 503, not 407).
type HostedVerdict struct {
	ID          wire.Identity
	TokenID     string // the token's nonce when its MAC verified: which token, without the token
	Expires     time.Time
	Refused     string
	Unavailable bool
}

// HostedCheck checks a credential: session is the Basic user, token the
// password. It must compare in constant time and fail closed.
type HostedCheck func(ctx context.Context, session, token string) HostedVerdict

// HostedRefusal is one refused hosted connection or request, for the
// audit log and the log line: never the token.
type HostedRefusal struct {
	Reason  string
	ID      wire.Identity // the token's claims when its MAC verified, else zero
	TokenID string        // the token's id when its MAC verified
	Remote  string
	Method  string
	Target  string // the request target's host (CONNECT authority or URL host), "" for a tool API path
	Status  int
}

// HostedOptions are the hooks of ListenHosted.
type HostedOptions struct {
	Check   HostedCheck
	Refused func(HostedRefusal) // audits and logs a refusal; nil: none
	// RefusalBudget refusals naming no token are audited per source
	// address and RefusalWindow (zero: the defaults); past it each is
	// counted by Unaudited and the window's are audited once by
	// Summarised (hosted_budget.go). Nil hooks: none.
	RefusalBudget int
	RefusalWindow time.Duration
	Unaudited     func()
	Summarised    func(HostedSummary)
}

// hostedState is an admitted hosted connection's credential: the exact
// header value its first request carried, and when the token expires.
type hostedState struct {
	cred    string
	expires time.Time
	remote  string
	id      wire.Identity
	tokenID string
}

// Realm is the Basic realm of the hosted listener's 407 answers.
const Realm = "sluice"

// MaxHostedPending bounds the hosted connections being identified at once
// (TLS handshake and first head, up to preambleTimeout each): the caps of
// admitted connections apply only once a token named the sandbox, and the
// listener may face more than sandboxes. More are closed at once (counted
// as gateway_busy).
const MaxHostedPending = 256

// HostedTLSConfig loads the hosted listener's certificate. No client
// certificate is asked for: the token is the credential.
func HostedTLSConfig(h *config.Hosted) (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(h.CertFile, h.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("gateway.hosted: certificate: %w", err)
	}
	return &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"}}, nil
}

// ListenHosted accepts hosted sandboxes on addr into l until l is closed.
func (l *Listener) ListenHosted(addr string, cfg *tls.Config, o HostedOptions) (net.Addr, error) {
	if o.Check == nil {
		return nil, errors.New("bug(): ListenHosted without a Check")
	}
	if o.Refused == nil {
		o.Refused = func(HostedRefusal) {}
	}
	if o.Unaudited == nil {
		o.Unaudited = func() {}
	}
	if o.Summarised == nil {
		o.Summarised = func(HostedSummary) {}
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("gateway.hosted.listen: %w", err)
	}
	l.hosted = o
	l.budget = newRefusalBudget(o.RefusalBudget, o.RefusalWindow, time.Now)
	go func() {
		<-l.done
		ln.Close()
		for _, s := range l.budget.flush() { // the windows still open
			o.Summarised(s)
		}
	}()
	pending := make(chan struct{}, MaxHostedPending)
	admit := func(c net.Conn) {
		select {
		case pending <- struct{}{}:
		default:
			l.refused(refusal.GatewayBusy)
			c.Close() // before TLS: no answer is possible that costs less
			return
		}
		ic := l.identifyHosted(c, cfg)
		<-pending
		l.admitCapped(ic)
	}
	go func() {
		if err := l.accepting(ln.Accept, admit); err != nil {
			l.log.Error("hosted listener: accept failed; hosted sandboxes are no longer served", "err", err)
		}
	}()
	return ln.Addr(), nil
}

// identifyHosted completes the handshake, reads the first request head
// (without consuming it: the server reads it again, through StrictHeads)
// and checks its credential, all within preambleTimeout. It returns the
// connection identified by the token, or nil when it was refused
// (answered and closed).
func (l *Listener) identifyHosted(c net.Conn, cfg *tls.Config) *Conn {
	remote := c.RemoteAddr().String()
	_ = c.SetDeadline(time.Now().Add(preambleTimeout))
	tc := tls.Server(c, cfg)
	if err := tc.Handshake(); err != nil {
		l.log.Warn("hosted listener: refused connection: TLS handshake failed", "remote", remote, "err", err)
		l.refused(refusal.UntrustedPeer)
		c.Close()
		return nil
	}
	br := bufio.NewReaderSize(tc, MaxHeaderBytes)
	head, err := peekHead(br)
	if err != nil {
		status, code := http.StatusBadRequest, refusal.BadRequest
		if errors.Is(err, bufio.ErrBufferFull) {
			status, code = http.StatusRequestHeaderFieldsTooLarge, refusal.HeaderTooLarge
		}
		l.log.Warn("hosted listener: refused connection: no complete request head", "remote", remote, "err", err)
		l.refused(code)
		rejectConn(tc, status, code, "a hosted sandbox's connection must start with an HTTP/1.1 request")
		return nil
	}
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		l.log.Warn("hosted listener: refused connection: malformed request head", "remote", remote)
		l.refused(refusal.BadRequest)
		rejectConn(tc, http.StatusBadRequest, refusal.BadRequest, "malformed request head")
		return nil
	}
	ref := HostedRefusal{Remote: remote, Method: req.Method, Target: targetHost(req)}
	cred, session, token, why := credential(req)
	if why != "" {
		ref.Reason, ref.Status = why, http.StatusProxyAuthRequired
		l.refuseHosted(tc, ref)
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), preambleTimeout)
	v := l.hosted.Check(ctx, session, token)
	cancel()
	if v.Refused != "" {
		ref.Reason, ref.ID, ref.TokenID, ref.Status = v.Refused, v.ID, v.TokenID, http.StatusProxyAuthRequired
		if v.Unavailable {
			ref.Status = http.StatusServiceUnavailable
		}
		l.refuseHosted(tc, ref)
		return nil
	}
	id, err := canonicalIdentity(v.ID)
	if err != nil || id != v.ID {
		// Minted in canonical form: anything else is not ours.
		ref.Reason, ref.Status = "identity_not_canonical", http.StatusProxyAuthRequired
		l.refuseHosted(tc, ref)
		return nil
	}
	_ = c.SetDeadline(time.Time{})
	ic := &Conn{Conn: tc, r: br, base: br, id: id, hosted: &hostedState{cred: cred, expires: v.Expires, remote: remote, id: id, tokenID: v.TokenID}}
	// The token's end is the connection's end, tunnels included. The
	// timer is armed only once ic holds it (it may fire at once).
	ic.expiry = time.AfterFunc(time.Hour, func() { _ = ic.Close() })
	ic.expiry.Reset(time.Until(v.Expires))
	return ic
}

// refuseHosted records a refused connection and answers it: 407 with a
// Basic challenge (503 when the store could not say), then closes it.
func (l *Listener) refuseHosted(c net.Conn, r HostedRefusal) {
	l.reportHosted(r)
	code := refusal.Unauthenticated
	msg := "a hosted sandbox must present its per-run token: Proxy-Authorization: Basic base64(SESSION:TOKEN) (HTTPS_PROXY=https://SESSION:TOKEN@host:port)"
	if r.Status == http.StatusServiceUnavailable {
		code, msg = refusal.StoreUnavailable, "whether the token's session has ended cannot be read; retry"
	}
	l.refused(code)
	rejectHosted(c, r.Status, code, msg, r.Reason)
}

// reportHosted hands a refusal to HostedOptions.Refused, within the
// source address's budget when it names no token (see above).
func (l *Listener) reportHosted(r HostedRefusal) {
	if r.ID.Session != "" || l.budget == nil {
		l.hosted.Refused(r)
		return
	}
	audit, done := l.budget.take(r.Remote)
	for _, s := range done {
		l.hosted.Summarised(s)
	}
	if audit {
		l.hosted.Refused(r)
	} else {
		l.hosted.Unaudited()
	}
}

// rejectHosted is rejectConn with the challenge of a 407 and the reason
// word (never the token).
func rejectHosted(c net.Conn, status int, code refusal.Code, msg, reason string) {
	body := fmt.Sprintf(`{"error":{"code":%q,"message":%q,"reason":%q}}`+"\n", code, msg, reason)
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	challenge := ""
	if status == http.StatusProxyAuthRequired {
		challenge = "Proxy-Authenticate: Basic realm=\"" + Realm + "\"\r\n"
	}
	fmt.Fprintf(c, "HTTP/1.1 %d %s\r\n%sContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
		status, statusText(status), challenge, len(body), body)
	if tc, ok := c.(*tls.Conn); ok {
		_ = tc.CloseWrite()
	}
	_ = c.SetReadDeadline(time.Now().Add(250 * time.Millisecond))
	var b [4096]byte
	for i := 0; i < 16; i++ { // drain a little so the answer is not lost to a reset
		if _, err := c.Read(b[:]); err != nil {
			break
		}
	}
	c.Close()
}

// peekHead returns the first request head in br (up to and including
// its blank line) without consuming it.
func peekHead(br *bufio.Reader) ([]byte, error) {
	for {
		b, _ := br.Peek(br.Buffered())
		if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
			return b[:i+4], nil
		}
		if br.Buffered() >= br.Size() {
			return nil, bufio.ErrBufferFull
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil { // waits for more bytes
			if b, _ := br.Peek(br.Buffered()); bytes.Contains(b, []byte("\r\n\r\n")) {
				continue
			}
			return nil, err
		}
	}
}

// credential is the request's credential: exactly one Proxy-Authorization
// (or, on a tool API request made to the listener directly, with none,
// exactly one Authorization) of scheme Basic. cred is the header's exact
// value, which every later request on the connection must repeat; why is
// a refusal reason, "" when found.
func credential(r *http.Request) (cred, session, token, why string) {
	vs := r.Header.Values("Proxy-Authorization")
	if len(vs) == 0 && r.Method != http.MethodConnect && !r.URL.IsAbs() {
		vs = r.Header.Values("Authorization")
	}
	switch {
	case len(vs) == 0:
		return "", "", "", "missing"
	case len(vs) > 1:
		return "", "", "", "several_credentials"
	}
	scheme, enc, ok := strings.Cut(vs[0], " ")
	if !ok || !strings.EqualFold(scheme, "basic") {
		return "", "", "", "not_basic"
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "", "", "", "malformed"
	}
	session, token, ok = strings.Cut(string(raw), ":")
	if !ok || session == "" || token == "" {
		return "", "", "", "malformed"
	}
	return vs[0], session, token, ""
}

// targetHost is what the refusal record names as the destination: the
// host of a proxy request, never a path or query (they may hold anything).
func targetHost(r *http.Request) string {
	if r.Method == http.MethodConnect {
		return r.Host
	}
	if r.URL.IsAbs() {
		return r.URL.Host
	}
	return ""
}

type hostedKey struct{}

// HostedFrom reports whether a request's connection came through the
// hosted listener (a per-run token admitted it), from the connection's
// context (ConnContext): never from anything the request says.
func HostedFrom(ctx context.Context) bool {
	_, ok := ctx.Value(hostedKey{}).(*hostedState)
	return ok
}

// HostedGate guards every request of a hosted connection: it must carry
// the credential the connection was admitted with (compared in constant
// time), before the token's expiry; otherwise it is answered 407 and the
// connection closed. The credential headers are removed before next sees
// the request. Requests of other connections pass untouched.
func (l *Listener) HostedGate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h, ok := r.Context().Value(hostedKey{}).(*hostedState)
		if !ok {
			next.ServeHTTP(w, r)
			return
		}
		cred, _, _, why := credential(r)
		switch {
		case why != "":
		case subtle.ConstantTimeCompare([]byte(cred), []byte(h.cred)) != 1:
			why = "credential_changed"
		case !time.Now().Before(h.expires):
			why = "expired"
		}
		if why != "" {
			l.hosted.Refused(HostedRefusal{Reason: why, ID: h.id, TokenID: h.tokenID, Remote: h.remote, Method: r.Method, Target: targetHost(r), Status: http.StatusProxyAuthRequired})
			l.refused(refusal.Unauthenticated)
			w.Header().Set("Proxy-Authenticate", `Basic realm="`+Realm+`"`)
			w.Header().Set("Connection", "close")
			refusal.Write(w, refusal.New(http.StatusProxyAuthRequired, refusal.Unauthenticated,
				"every request on a hosted connection must carry the per-run token it was opened with ("+why+")"), refusal.NewRequestID())
			return
		}
		r.Header.Del("Proxy-Authorization")
		if r.Method != http.MethodConnect && !r.URL.IsAbs() {
			r.Header.Del("Authorization") // the tool API's: its upstream headers are in the body
		}
		next.ServeHTTP(w, r)
	})
}
