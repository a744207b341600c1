package config

import "time"

// MinHoldLease is the shortest gateway.hold_lease: the replica renews its
// leases every third of it, and a renewal is one statement.
const MinHoldLease = time.Second

// validateHoldLease checks gateway.hold_lease: 0 (unset) is the default
// (15s, holds.DefaultLease); otherwise at least MinHoldLease. On a store
// several replicas share, a replica killed while sending approved held
// calls leaves them to the others after at most this long; shorter means
// a faster takeover but a replica that cannot reach the database for
// longer than it (a renewal failed) loses its leases.
func (g Gateway) validateHoldLease(bad func(key, format string, args ...any)) {
	if g.HoldLease != 0 && g.HoldLease < Duration(MinHoldLease) {
		bad("gateway.hold_lease", "%s: want at least %s (or unset: 15s)", g.HoldLease.Std(), MinHoldLease)
	}
}
