package gateway

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluice-gw/sluice/gateway/refusal"
	"github.com/sluice-gw/sluice/gateway/store"
)

// storeRefusal is 503 store_unavailable when err means the store was not
// reached (store.ErrUnavailable), else nil: a refusal the caller already
// chose stands for every other error.
func storeRefusal(err error) *refusal.Error {
	if !errors.Is(err, store.ErrUnavailable) {
		return nil
	}
	return refusal.New(http.StatusServiceUnavailable, refusal.StoreUnavailable, "the gateway's state store is unavailable; the call was not sent").Wrap(err)
}

// storeReadyTimeout bounds /readyz's store check: a load balancer asks
// often and must not queue behind a hung database.
const storeReadyTimeout = 2 * time.Second

// storeProblem is /readyz's check of st: "" when the store answers.
func storeProblem(ctx context.Context, st *store.Store) string {
	ctx, cancel := context.WithTimeout(ctx, storeReadyTimeout)
	defer cancel()
	if err := st.Ping(ctx); err != nil {
		return "store: unavailable (" + st.Kind().String() + "); calls that need state are refused 503 store_unavailable"
	}
	if err := st.ReplicaErr(); err != nil { // THREATS G21, replica.go
		return err.Error()
	}
	return ""
}
