// Package e2e runs the real sluice binary end to end: the gateway serves
// inside a network namespace the test creates (so a broken guard can reach
// nothing off the machine), an upstream HTTP server listens on that
// namespace's loopback, and the tests talk to the gateway's Unix socket as
// sandboxd would, with an identity preamble. They assert HTTP status, the
// stable error code, what reached the upstream, the decision log and the
// audit log. They need root and iproute2 and skip with a reason otherwise.
// The harness (binary, namespace, upstream, gateway process, clients) is
// test/internal/gwenv, shared with the fault and attack suites.
package e2e
