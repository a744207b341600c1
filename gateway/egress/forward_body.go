package egress

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/sluice-gw/sluice/gateway/h1"
	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/policy/findings"
)

// maxProxiedBody bounds a forward-proxied request's body, as sent and
// decoded: the scanner's bound (findings.MaxBytes), so that all of what
// policy decides on was scanned. A larger body is refused, never sent
// unscanned.
const maxProxiedBody = findings.MaxBytes

// proxiedBody reads a forward-proxied request's body before the decision
// ("decide on what is sent"): raw is exactly what will be forwarded,
// text the body as policy and the findings scanner read it (decoded
// from its content coding). Content codings are an allow-list: none or
// identity, or one layer of gzip; anything else is refused, since what
// cannot be decoded cannot be scanned.
//
// The body must arrive within gateway.request_body_timeout (extended by
// its minimum rate), as an intercepted request's must (B10): a body that
// stalls is refused 408 request_timeout, never waited for.
func proxiedBody(w http.ResponseWriter, r *http.Request, lim h1.BodyLimit) (raw []byte, text string, ee *egressError) {
	coding, err := contentCoding(r.Header)
	if err != nil {
		return nil, "", egressRefuse(http.StatusUnsupportedMediaType, refusal.SchemaViolation, psBadRequest, err.Error())
	}
	if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
		return nil, "", nil
	}
	if r.ContentLength > maxProxiedBody {
		return nil, "", tooLarge()
	}
	bb := h1.Bound(r.Body, http.NewResponseController(w), lim)
	raw, err = io.ReadAll(io.LimitReader(bb, maxProxiedBody+1))
	switch {
	case err != nil && bb.TimedOut():
		w.Header().Set("Connection", "close")
		return nil, "", egressRefuse(http.StatusRequestTimeout, refusal.RequestTimeout, psBadRequest, fmt.Sprintf(
			"the request body did not arrive in time: %s plus a second per %d bytes (gateway.request_body_timeout, gateway.request_body_min_rate)",
			lim.Timeout, lim.MinRate))
	case err != nil:
		return nil, "", egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "the request body could not be read")
	case len(raw) > maxProxiedBody:
		return nil, "", tooLarge()
	case coding == "":
		return raw, string(raw), nil
	}
	br := bytes.NewReader(raw) // a ByteReader: gzip reads no further than its stream
	zr, err := gzip.NewReader(br)
	if err != nil {
		return nil, "", egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "the request body is not valid gzip (Content-Encoding: gzip)")
	}
	zr.Multistream(false)
	dec, err := io.ReadAll(io.LimitReader(zr, maxProxiedBody+1))
	switch {
	case err != nil:
		return nil, "", egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "the request body is not valid gzip (Content-Encoding: gzip)")
	case len(dec) > maxProxiedBody:
		return nil, "", tooLarge()
	}
	if br.Len() != 0 { // sent, it would reach the upstream unscanned
		return nil, "", egressRefuse(http.StatusBadRequest, refusal.SchemaViolation, psBadRequest, "data after the gzip stream in the request body")
	}
	return raw, string(dec), nil
}

func tooLarge() *egressError {
	return egressRefuse(http.StatusRequestEntityTooLarge, refusal.SchemaViolation, psBadRequest,
		fmt.Sprintf("the request body is over %d bytes (as sent or decoded): it cannot be scanned before the decision, so it is not sent", maxProxiedBody))
}

// contentCoding is the request's content coding: "" (none, or identity)
// or "gzip". Several layers, or any other coding, are an error naming it.
func contentCoding(h http.Header) (string, error) {
	var codings []string
	for _, v := range h.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	switch {
	case len(codings) == 0:
		return "", nil
	case len(codings) == 1 && (codings[0] == "gzip" || codings[0] == "x-gzip"):
		return "gzip", nil
	}
	return "", errors.New("Content-Encoding " + strings.Join(codings, ", ") + " is not accepted on proxied requests: only none, identity or one gzip layer can be scanned before the decision")
}
