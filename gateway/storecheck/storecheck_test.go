package storecheck

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
)

// TestRefusal: only an error that means the store was not reached is 503
// store_unavailable (wrapped or not); any other error, and none, leaves
// the caller's own refusal standing.
func TestRefusal(t *testing.T) {
	for _, err := range []error{store.ErrUnavailable, fmt.Errorf("take tokens: %w", store.ErrUnavailable)} {
		e := Refusal(err)
		if e == nil || e.Status != http.StatusServiceUnavailable || e.Code != refusal.StoreUnavailable || !errors.Is(e.Cause(), store.ErrUnavailable) {
			t.Errorf("Refusal(%v) = %+v, want 503 store_unavailable wrapping it", err, e)
		}
	}
	for _, err := range []error{nil, store.ErrNotFound, errors.New("constraint failed")} {
		if e := Refusal(err); e != nil {
			t.Errorf("Refusal(%v) = %+v, want nil", err, e)
		}
	}
}
