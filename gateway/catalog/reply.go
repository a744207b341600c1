package catalog

import (
	"bytes"
	"crypto/subtle"
	"errors"
	"net/http"
	"slices"
	"strings"

	"github.com/sluice-gw/sluice/gateway/scrub"
)

// scrubCache is an upstream's scrubber for one credential. Preparing a
// scrubber (every encoding of the secret) costs more per call than
// scrubbing a small reply, and a connector's credential rarely changes.
type scrubCache struct {
	forms [][]byte // what the scrubber was made from
	scr   *scrub.Scrubber
}

// Scrubber returns the scrubber for forms, made once per credential: a
// changed credential (rotated, per-call, per-session) makes a new one.
func (u *Upstream) Scrubber(forms [][]byte) *scrub.Scrubber {
	if c := u.scrub.Load(); c != nil && sameForms(c.forms, forms) {
		return c.scr
	}
	scr := scrub.New(forms...)
	kept := make([][]byte, len(forms))
	for i, f := range forms {
		kept[i] = bytes.Clone(f)
	}
	u.scrub.Store(&scrubCache{forms: kept, scr: scr})
	return scr
}

// sameForms compares in constant time for equal lengths: the forms are
// secrets.
func sameForms(a, b [][]byte) bool {
	if len(a) != len(b) {
		return false
	}
	same := 1
	for i := range a {
		same &= subtle.ConstantTimeCompare(a[i], b[i])
	}
	return same == 1
}

// ResponseHeaders copies the end-to-end headers of an upstream reply.
func ResponseHeaders(h http.Header) map[string][]string {
	out := make(map[string][]string, len(h))
	for k, vs := range h {
		switch k {
		case "Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
			continue
		}
		out[k] = slices.Clone(vs)
	}
	return out
}

// ReplyReason is the stable reason of a reply scrub.Reply refused.
func ReplyReason(err error) string {
	var re *scrub.ReplyError
	if errors.As(err, &re) {
		return re.Reason
	}
	return "unreadable_reply"
}

// IsJSON says whether the media type ct is JSON (application/json, or
// any +json suffix).
func IsJSON(ct string) bool {
	ct, _, _ = strings.Cut(ct, ";")
	ct = strings.TrimSpace(strings.ToLower(ct))
	return ct == "application/json" || strings.HasSuffix(ct, "+json")
}
