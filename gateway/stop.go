package gateway

import (
	"context"
	"net/http"
	"time"
)

// shutdownGrace bounds a graceful shutdown: requests still running after
// it have their connections closed.
const shutdownGrace = 10 * time.Second

// shutdown stops servers gracefully. Long-lived requests are told first
// (stopHooks.begin: a DNS stream stops reading questions, answers those in
// flight and ends its body), so that Shutdown waits for them only as long
// as their answers take; whatever still runs after shutdownGrace has its
// connection closed rather than outliving Serve. Then the idle upstream
// connections of raw egress are closed.
func (s *Server) shutdown(servers []*http.Server) {
	s.stop.Begin()
	ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	for _, srv := range servers {
		if err := srv.Shutdown(ctx); err != nil {
			s.log.Warn("gateway: shutdown: grace period over; closing the connections still busy", "grace", shutdownGrace.String(), "err", err)
			_ = srv.Close()
		}
	}
	s.stop.CloseAll()
}
