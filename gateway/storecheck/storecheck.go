// Package storecheck is how the gateway closes when its state store
// fails: the refusal of a call whose state could not be read (503
// store_unavailable) and /readyz's check of the store.
package storecheck

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
)

// Refusal is 503 store_unavailable when err means the store was not
// reached (store.ErrUnavailable), else nil: a refusal the caller already
// chose stands for every other error.
func Refusal(err error) *refusal.Error {
	if !errors.Is(err, store.ErrUnavailable) {
		return nil
	}
	return refusal.New(http.StatusServiceUnavailable, refusal.StoreUnavailable, "the gateway's state store is unavailable; the call was not sent").Wrap(err)
}

// storeReadyTimeout bounds /readyz's store check: a load balancer asks
// often and must not queue behind a hung database.
const storeReadyTimeout = 2 * time.Second

// Problem is /readyz's check of st: "" when the store answers.
func Problem(ctx context.Context, st *store.Store) string {
	ctx, cancel := context.WithTimeout(ctx, storeReadyTimeout)
	defer cancel()
	if err := st.Ping(ctx); err != nil {
		return "store: unavailable (" + st.Kind().String() + "); calls that need state are refused 503 store_unavailable"
	}
	if err := st.ReplicaErr(); err != nil { // THREATS G21, the root's replica.go
		return err.Error()
	}
	return ""
}
