package refusal_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
)

// The cause set by Wrap is for the log line only: it must not reach the
// body the agent reads, nor the Error string.
func TestWrapKeepsTheCauseOutOfTheAnswer(t *testing.T) {
	secret := errors.New("vault: permission denied for token s.hunter2")
	e := refusal.New(http.StatusServiceUnavailable, refusal.CredentialUnavailable, "the credential for this connector is unavailable").Wrap(secret)
	if !errors.Is(e.Cause(), secret) {
		t.Fatalf("Cause() = %v, want the wrapped error", e.Cause())
	}
	w := httptest.NewRecorder()
	refusal.Write(w, e, "rid-1")
	if w.Code != http.StatusServiceUnavailable {
		t.Errorf("status %d, want 503", w.Code)
	}
	if strings.Contains(w.Body.String(), "hunter2") || strings.Contains(e.Error(), "hunter2") {
		t.Fatalf("the cause leaked: body %q, Error() %q", w.Body.String(), e.Error())
	}
	var b refusal.Body
	if err := json.Unmarshal(w.Body.Bytes(), &b); err != nil {
		t.Fatal(err)
	}
	if b.Error.Code != refusal.CredentialUnavailable || b.Error.RequestID != "rid-1" {
		t.Errorf("body %+v", b)
	}
	for k, want := range map[string]string{"Content-Type": "application/json", "X-Content-Type-Options": "nosniff", "Cache-Control": "no-store"} {
		if got := w.Header().Get(k); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
}

func TestRetryAfter(t *testing.T) {
	e := refusal.New(http.StatusTooManyRequests, refusal.RateLimited, "slow down")
	e.RetryAfter = 1500 * time.Millisecond
	w := httptest.NewRecorder()
	refusal.Write(w, e, "")
	if got := w.Header().Get("Retry-After"); got != "2" {
		t.Errorf("Retry-After = %q, want 2 (rounded up)", got)
	}
	for _, tc := range []struct {
		d    time.Duration
		want int
	}{{0, 1}, {time.Millisecond, 1}, {time.Second, 1}, {time.Second + 1, 2}, {90 * time.Second, 90}} {
		if got := refusal.RetryAfterSeconds(tc.d); got != tc.want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

func TestWriteUnauthenticated(t *testing.T) {
	w := httptest.NewRecorder()
	refusal.WriteUnauthenticated(w, "an approver token is needed", "rid-2")
	if w.Code != http.StatusUnauthorized || w.Header().Get("WWW-Authenticate") != `Bearer realm="sluice"` {
		t.Fatalf("status %d, WWW-Authenticate %q", w.Code, w.Header().Get("WWW-Authenticate"))
	}
	if !strings.Contains(w.Body.String(), `"code":"unauthenticated"`) {
		t.Errorf("body %s", w.Body.String())
	}
}

func TestNewRequestID(t *testing.T) {
	a, b := refusal.NewRequestID(), refusal.NewRequestID()
	if len(a) != 24 || strings.Trim(a, "0123456789abcdef") != "" || a == b {
		t.Fatalf("request ids %q, %q: want two different 24-digit hex strings", a, b)
	}
}

func ExampleWrite() {
	w := httptest.NewRecorder()
	e := refusal.New(http.StatusForbidden, refusal.EgressDenied, "destination 10.0.0.1 is not allowed (private)").Wrap(errors.New("dial: denied"))
	refusal.Write(w, e, "0123456789abcdef01234567")
	fmt.Print(w.Code, " ", w.Body.String())
	// Output: 403 {"error":{"code":"egress_denied","message":"destination 10.0.0.1 is not allowed (private)","request_id":"0123456789abcdef01234567"}}
}
