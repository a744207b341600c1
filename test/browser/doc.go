// Package browser drives the review web UI in a real Chromium (Debian's
// chromium, through chromedp) against a real in-process gateway: an agent's
// ask call is held, people sign in, watch it arrive live and decide it.
// The OAuth connection tests (oauth_test.go, mcp_oauth_test.go) run the
// real `sluice serve` binary instead, built by the test (serve_test.go).
// The tests skip, saying so, when /usr/bin/chromium is missing; test.sh
// installs it.
package browser
