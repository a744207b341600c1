package review

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-gw/sluice/gateway/config"
	"github.com/sluice-gw/sluice/gateway/holds"
	"github.com/sluice-gw/sluice/gateway/store"
)

// TestHoldPageLinksReceipt: once a hold has executed with a signed
// receipt, its page links to the receipt's download and to the key; a
// hold executed without one shows no link.
func TestHoldPageLinksReceipt(t *testing.T) {
	st, err := store.Open(context.Background(), "sqlite:"+filepath.Join(t.TempDir(), "s.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	e := &env{t: t, now: time.Now(), sent: make(chan holds.Hold, 10)}
	withReceipt := true
	e.mgr = holds.New(holds.Options{Store: st, Execute: func(ctx context.Context, h holds.Hold) (holds.Result, bool) {
		res := holds.Result{HTTPStatus: 200, Body: []byte(`{"ok":true}`), Answered: true}
		if withReceipt {
			res.Receipt = []byte(`{"receipt":{"hold_id":"` + h.ID + `"},"alg":"Ed25519","signature":"x"}`)
		}
		return res, true
	}})
	e.ui, err = New(Options{Holds: e.mgr, Now: e.clock,
		Users: []config.User{{Name: "alice", Groups: []string{"finance"}, PasswordHash: hash(t, "alice-pw")}},
		Audit: func(context.Context, string, map[string]any) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(e.ui)
	t.Cleanup(e.srv.Close)
	alice := e.browser()
	tok := alice.login("alice", "alice-pw")
	for _, tc := range []struct {
		name string
		with bool
	}{{"signed", true}, {"unsigned", false}} {
		t.Run(tc.name, func(t *testing.T) {
			withReceipt = tc.with
			h := e.hold(`{"id":1}`)
			if r, _ := alice.post("/holds/"+h.ID+"/approve", url.Values{"csrf": {tok}}, nil); r.StatusCode != http.StatusSeeOther {
				t.Fatalf("approve: %d", r.StatusCode)
			}
			_, page := alice.get("/holds/" + h.ID)
			link := `href="/api/v1/holds/` + h.ID + `/receipt"`
			if got := strings.Contains(page, link) && strings.Contains(page, `id="receipt"`); got != tc.with {
				t.Fatalf("receipt link shown = %v, want %v:\n%s", got, tc.with, page)
			}
		})
	}
}
