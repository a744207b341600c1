package review

import (
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/sluice-gw/sluice/gateway/holds"
)

// Outcome is what became of a decided hold, as its page states it.
type Outcome struct {
	// Sent says the request left the gateway (or may have: Unknown).
	Sent bool
	// Upstream is the upstream's HTTP status (0: it gave none).
	Upstream     int
	UpstreamText string
	// Code and Message are the gateway's refusal when the call was not
	// completed (re-evaluated to block, upstream unreachable …): the same
	// text the agent got, which never carries a secret.
	Code, Message string
}

// outcome reads a hold's stored result. The success body is the tool-call
// answer {"status","headers","body","request_id"}; a failure's is the
// refusal {"error":{"code","message"}}.
func outcome(h holds.Hold) Outcome {
	var o Outcome
	switch h.Status {
	case holds.Running, holds.Done, holds.Failed, holds.Unknown:
		o.Sent = true
	}
	if h.Result == nil {
		return o
	}
	var body struct {
		Status int `json:"status"`
		Error  *struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if json.Unmarshal(h.Result.Body, &body) != nil {
		return o
	}
	if body.Error != nil {
		o.Code, o.Message = body.Error.Code, body.Error.Message
		// A refusal before anything was dialled (blocked on
		// re-evaluation, no credential) is not a send.
		o.Sent = o.Code == "upstream_error"
		return o
	}
	if body.Status > 0 {
		o.Upstream, o.UpstreamText = body.Status, http.StatusText(body.Status)
	}
	return o
}

// stampHTML is a UTC time in a <time> element: the page's script adds the
// viewer's local time beside it, and without the script the UTC time is
// still there.
func stampHTML(t time.Time) template.HTML {
	if t.IsZero() {
		return ""
	}
	u := t.UTC()
	return template.HTML(fmt.Sprintf(`<time class="ts" datetime="%s">%s</time>`,
		u.Format(time.RFC3339Nano), u.Format("2006-01-02 15:04:05Z")))
}

// marked says whether any of the strings would show a marker (an
// invisible or bidi character, or a byte that is not UTF-8): the page then
// explains the markers in text.
func marked(ss ...string) bool {
	for _, s := range ss {
		for i := 0; i < len(s); {
			r, n := utf8.DecodeRuneInString(s[i:])
			if (r == utf8.RuneError && n == 1) || invisible(r) {
				return true
			}
			i += n
		}
	}
	return false
}

// holdMarked is marked over everything a hold's page shows of the agent's.
func holdMarked(h holds.Hold) bool {
	ss := []string{h.Tool, h.Request.Method, h.Request.URL, h.Caller.Agent, h.Caller.Session, h.Caller.User,
		h.Caller.Sandbox, h.Reason, h.DecisionReason}
	ss = jsonStrings(ss, h.Args)
	ss = jsonStrings(ss, h.Request.Body)
	for k, vs := range h.Request.Headers {
		ss = append(ss, k)
		ss = append(ss, vs...)
	}
	if h.Result != nil {
		ss = jsonStrings(ss, h.Result.Body)
	}
	return marked(ss...)
}

// jsonStrings appends the keys and string values of a JSON document (as
// prettyJSON shows them, escapes decoded), or the document itself when it
// is not JSON.
func jsonStrings(ss []string, doc []byte) []string {
	var v any
	if json.Unmarshal(doc, &v) != nil {
		return append(ss, string(doc))
	}
	var walk func(any)
	walk = func(v any) {
		switch x := v.(type) {
		case string:
			ss = append(ss, x)
		case []any:
			for _, e := range x {
				walk(e)
			}
		case map[string]any:
			for k, e := range x {
				ss = append(ss, k)
				walk(e)
			}
		}
	}
	walk(v)
	return ss
}
